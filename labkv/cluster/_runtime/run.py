"""Running a function as W ranks on Dask workers, xgboost-style.

Each rank is one Dask task pinned to its own worker (``workers=[address]``,
``allow_other_workers=False``). Pinning is what makes a rank a rank: the
ranks of a dist_sync store wait for each other inside every round, so they
must run *at the same time*, on distinct workers; letting Dask queue two
ranks on one single-threaded worker, or move one after a failure, would turn a
round into a deadlock.

For the same reason a missing or dying worker fails the run at once instead
of waiting for Dask to reschedule: the launcher checks the cluster's workers
every ``_POLL_S`` while the ranks run; when a rank fails or a worker hosting a
rank or a server disappears, it aborts the servers (waiting ranks get an
error at once instead of sitting out their timeout, in a barrier too: it is
held on server 0), cancels the other ranks and raises naming the rank or server lost.

:func:`run` checks its arguments and hands the run to a :class:`Run`, which holds
its state (servers, each rank's task and worker, the results gathered so far)
and makes each of the watcher's decisions in a method of its own.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..._types import SYNC_KINDS, dist_kind
from .._device import parse_server_device
from .._errors import ClusterError, ServerLost
from .._event_relay import rank_detail
from .._options import (
    DEFAULT_TIMEOUT_S,
    StoreSpec,
    check_replicas,
    check_staleness,
)
from .._placement import DEFAULT_BIGARRAY_BOUND
from .._rank.dist_store import DistStore
from .._transport.scheduler import raise_if_scheduler_gone, scheduler_gone
from .compat import check_cluster
from .connect import ClusterHandle, default_handle
from .elastic import Replacer, check_on_rank_loss, check_shrink
from .launch import check_cluster_args, start_servers
from .links import replicated_links
from .needs import modules_needed
from .progress import Progress, progress_topic
from .rank_task import RANK_KEY, rank_main
from .reseed import heal
from .waits import progress_on
from .watch import (
    _POLL_S,
    _abort,
    _result_of,
    _stop_ranks,
    _Wakeup,
    _warn_if_replays_differed,
)


def run(
    fn: Callable[..., Any],
    num_workers: int | None = None,
    kvstore: str | DistStore = "dist_sync",
    num_servers: int | None = None,
    cluster: ClusterHandle | None = None,
    args: tuple = (),
    kwargs: dict[str, Any] | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    bigarray_bound: int = DEFAULT_BIGARRAY_BOUND,
    server_device: str = "auto",
    staleness: int | None = None,
    replicas: int = 1,
    on_rank_loss: str = "fail",
    max_restarts: int = 3,
    replace_timeout: float = 60.0,
    seed: int = 0,
    progress: bool | None = None,
) -> list[Any]:
    """Run ``fn(kv, *args, **kwargs)`` as ``num_workers`` ranks, one pinned
    Dask task per worker, all on the same servers; the results in rank order.

    ``kvstore`` is a type (new servers are started for this run, ``num_servers``
    of them, default ``num_workers``, and released after it) or a store made
    in this process with ``labkv.create`` (its servers are shared: the notebook
    watches the ranks' keys, and a monitor of that store sees the servers' and
    the ranks' events; it owns the optimizer and the keys it initialised before
    the run, and its own pushes should wait until the run is over). On a
    shared store, rank 0 initialises (with its values) every key the notebook
    did not, as in a run with its own servers, so that ``if kv.rank == 0:
    kv.init(...)`` followed by ``kv.barrier()`` works on both kinds of run:
    rank 0's values, not the first init to arrive, so that both start from the
    same values whichever rank comes first (docs/cluster.md). A rank that uses
    a key no init has reached is refused at once, naming the rank and the fix. ``cluster`` defaults to the cluster this
    process attached to (see :func:`labkv.cluster.default_handle`), an
    embedded one only when there is none; its scheduler and workers are
    checked first, as ``labkv.create`` checks them, and so is what ``fn``
    imports (torch for a torch model: the scheduler and every worker that may
    run a rank must have it; a node without it fails the run within seconds,
    named, before anything starts). ``num_workers`` defaults to all
    the cluster's workers; asking for more fails at once. ``timeout`` bounds
    every wait of the ranks (rounds, init, barrier); ``bigarray_bound`` is the
    size from which values are sliced across servers; ``server_device`` where
    new servers keep their values (``'auto'``: a GPU when their worker has one;
    see ``labkv.create``); ``staleness`` the bound of a new ``'dist_ssp'``
    store (a shared store keeps its own); ``replicas`` how many copies of each
    new server live on different workers: with 2 or more, the run survives
    the loss of a worker that hosts only servers (the next replica takes
    over, a new one is seeded, nothing acknowledged is lost).

    ``on_rank_loss``: what a lost rank does to the run (its worker died,
    was killed or restarted). ``"fail"`` (the default) stops the run and
    raises, naming the rank. ``"replace"`` starts the rank again on a worker
    that runs no rank (a spare, or the lost worker once its nanny has
    restarted it; waiting at most ``replace_timeout`` seconds for one, and the
    other ranks' waits last that much longer than ``timeout``), at
    most ``max_restarts`` times per rank, and the run goes on: with the step
    loop (``for step in kv.steps(n)``) the replacement resumes at the step
    its rank was lost in, and a dist_sync run ends bit-identical to an
    undisturbed one (what each store type guarantees is in
    ``docs/cluster.md``; a replayed step that pushed other bits than the lost
    incarnation's is a ``RuntimeWarning`` when the run ends). A rank lost three
    times at the same step (itself, then its replacement twice) fails the run (a
    step that kills its worker every time is a crash). ``"shrink"`` (dist_async and
    dist_ssp only) goes on without the lost rank: its result is None, the
    barriers and dist_ssp pulls stop waiting for it, and the rest of its
    partition is not trained on (each remaining push is still applied as it
    comes, so the model learns from the other ranks' data only; a rank
    dividing by ``kv.num_workers`` still divides by the ranks it started
    with). ``seed`` seeds every ``step.rng``, with the rank and the step.
    ``progress``: while the ranks loop over ``kv.steps(n)``, where the run is
    (the slowest rank's step, of how many) shows as one line, on stderr in a
    terminal and updated in place in a notebook; ``progress=False`` shows nothing
    (default: Dask config ``labkv.progress``, True unless set).

    >>> from labkv.cluster import connect, run
    >>> def train(kv):
    ...     kv.init(0, np.zeros(2)); kv.push(0, np.full(2, kv.rank + 1.0)); return kv.pull(0)
    >>> with connect(n_workers=2) as handle:  # doctest: +SKIP
    ...     run(train, num_workers=2, cluster=handle)
    [array([3., 3.]), array([3., 3.])]
    >>> with connect(n_workers=3) as handle:  # doctest: +SKIP
    ...     run(train, num_workers=2, cluster=handle, num_servers=1, replicas=2)
    [array([3., 3.]), array([3., 3.])]
    >>> def steps(kv):
    ...     kv.init(0, np.zeros(2))
    ...     for step in kv.steps(10):
    ...         kv.push(0, step.rng.standard_normal(2)); w = kv.pull(0)
    ...     return w
    >>> with connect(n_workers=3) as handle:  # one spare worker  # doctest: +SKIP
    ...     run(steps, num_workers=2, cluster=handle, replicas=2, on_rank_loss="replace")
    """
    kwargs = dict(kwargs or {})
    check_on_rank_loss(on_rank_loss, max_restarts, replace_timeout)
    shared = isinstance(kvstore, DistStore)
    if shared:
        if kvstore.handle is None:
            raise ValueError("only a store made in this process (labkv.create) can be shared")
        if staleness is not None:
            raise ValueError(
                "staleness is set when a 'dist_ssp' store is made; a shared store keeps "
                f"its own ({kvstore.staleness!r})"
            )
        if replicas != 1:
            raise ValueError(
                "replicas are set when a store is made; a shared store keeps its own "
                f"({kvstore.spec.replicas})"
            )
        check_shrink(on_rank_loss, kvstore.spec.sync)
        handle = kvstore.handle
    else:
        kind = dist_kind(kvstore)
        check_shrink(on_rank_loss, kind in SYNC_KINDS)
        check_cluster_args(cluster, timeout)
        staleness = check_staleness(kind, staleness)
        replicas = check_replicas(replicas)
        parse_server_device(server_device)
        handle = cluster if cluster is not None else default_handle()
    workers = handle.workers()
    num_workers = len(workers) if num_workers is None else num_workers
    if not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
    if num_workers > len(workers):
        hint = (
            f"; start an embedded cluster with enough: labkv.cluster.connect(n_workers={num_workers})"
            if handle.cluster is not None
            else f"; start more workers for it, or ask for num_workers <= {len(workers)}"
        )
        raise ClusterError(
            f"run needs {num_workers} Dask workers (one per rank); the cluster has "
            f"{len(workers)}: {workers}{hint}"
        )
    # The modules fn needs (torch for a torch model): on the scheduler, which
    # unpickles the ranks' tasks, and on every worker that may run a rank.
    needs = modules_needed(fn, tuple(args), kwargs)
    rank_nodes = workers if on_rank_loss == "replace" else workers[:num_workers]
    name = getattr(fn, "__name__", type(fn).__name__)
    check_cluster(handle, workers, needs, rank_nodes, subject=f"the rank function {name}")
    new_servers = None
    if not shared:
        new_servers = NewServers(
            kind,
            num_servers or num_workers,
            timeout,
            server_device,
            bigarray_bound,
            kvstore.lower(),
            staleness,
            replicas,
        )
    return Run(
        handle,
        RankTask(fn, tuple(args), kwargs, num_workers),
        workers,
        store=kvstore if shared else None,
        new_servers=new_servers,
        on_rank_loss=on_rank_loss,
        max_restarts=max_restarts,
        replace_timeout=replace_timeout,
        seed=seed,
        progress=progress,
    ).execute()


@dataclasses.dataclass(frozen=True)
class RankTask:
    """What every rank runs: ``fn(kv, *args, **kwargs)``, as rank r of ``num_workers``."""

    fn: Callable[..., Any]
    args: tuple
    kwargs: dict[str, Any]
    num_workers: int


@dataclasses.dataclass(frozen=True)
class NewServers:
    """The servers a run starts for itself (its ``kvstore`` a type, not a shared store)."""

    kind: str
    num_servers: int
    timeout: float
    server_device: str
    bigarray_bound: int
    name: str
    staleness: int | None
    replicas: int


# How long a rank failed by a lost server waits for the scheduler to remove that
# server's worker: the lost worker, once named, explains the failure best.
_REMOVAL_WAIT_S = 3.0


class Run:
    """One call of :func:`run`: its servers, its ranks' futures and workers, the
    results gathered so far, and the watcher's decisions (module doc), each a
    method. ``execute`` starts the servers and the ranks, watches them, and
    releases what the run started."""

    def __init__(
        self,
        handle: ClusterHandle,
        task: RankTask,
        workers: list[str],
        *,
        store: DistStore | None = None,
        new_servers: NewServers | None = None,
        on_rank_loss: str = "fail",
        max_restarts: int = 3,
        replace_timeout: float = 60.0,
        seed: int = 0,
        progress: bool | None = None,
    ) -> None:
        self.handle, self.client, self.task = handle, handle.client, task
        self.workers = workers  # the cluster's, as checked: new servers go on them
        self.store, self.new_servers = store, new_servers  # a shared store, or servers to start
        self.on_rank_loss, self.max_restarts = on_rank_loss, max_restarts
        self.replace_timeout, self.seed, self.progress = replace_timeout, seed, progress
        self.group = f"labkv-barrier-{uuid.uuid4().hex[:8]}"  # this run's own barrier group
        self.spec: StoreSpec | None = None
        self.servers: list[Any] = []
        self.to_release: Any = None  # the futures of the servers the run started
        self.reseeded: list[Any] = []  # replicas started after a loss, released with the run's
        self.detail: tuple[float, int] | None = None
        self.topic: str | None = None  # the ranks' steps, for the progress line
        self.shown: Progress | None = None
        self.futures: list[Any] = []  # each rank's current task
        self.rank_workers = workers[: task.num_workers]  # each rank's current worker
        self.results: dict[int, Any] = {}  # gathered as each rank finishes: its worker may go later
        self.links: list[Any] = []  # the watcher's replicated links (none without replicas)
        self.replace: Replacer | None = None  # with on_rank_loss "replace" or "shrink"
        self.wakeup = _Wakeup(self.client)
        self.seen: set[str] = set()  # the live workers when the watcher last looked at replicas

    def execute(self) -> list[Any]:
        """Start, watch and release the run; the ranks' results in rank order."""
        self.start()
        self.submit_ranks()
        ok = False
        try:
            with self.client.as_current():  # distributed.wait looks for "the current client"
                out = self.watch()
            ok = True
        except ClusterError:
            raise
        except Exception as exc:  # a broken connection: a lost scheduler explains it best
            self.raise_if_scheduler_lost(exc)
            raise
        except BaseException as exc:  # Ctrl-C: no rank may go on writing to the store
            self.stop(exc)
            raise
        finally:
            self.release(ok)
        return out

    def start(self) -> None:
        """The run's servers (a shared store's, or new ones) and its spec: its own
        barrier group, its seed, and how long servers hold their waits for a
        replacement (the ranks wait as long)."""
        store, new = self.store, self.new_servers
        num_workers = self.task.num_workers
        if store is not None:
            store.flush()
            spec, self.servers = store.spec, store.servers
            store.configure_ranks(num_workers)
        else:
            try:
                self.to_release, self.servers, spec = start_servers(
                    self.handle,
                    new.kind,
                    new.num_servers,
                    num_workers,
                    new.timeout,
                    self.workers,
                    new.server_device,
                    new.bigarray_bound,
                    name=new.name,
                    staleness=new.staleness,
                    replicas=new.replicas,
                )
            except Exception:  # Dask's "futures cancelled": a lost scheduler explains it best
                raise_if_scheduler_gone(self.client)
                raise
        hold = self.replace_timeout if self.on_rank_loss == "replace" else 0.0
        self.spec = dataclasses.replace(
            spec, group=self.group, seed=int(self.seed), replace_hold=hold
        )
        # The notebook watches the shared store: the ranks stream their own events too.
        if store is not None and store.events.active:
            self.detail = rank_detail(store.events, num_workers)

    def submit_ranks(self) -> None:
        """Show the progress line (unless turned off) and submit every rank."""
        progress = progress_on() if self.progress is None else self.progress
        self.topic = progress_topic(self.group) if progress else None
        if self.topic is not None:
            self.shown = Progress(self.client, self.topic, self.task.num_workers).start()
        self.futures = [self.submit(r, 0, w) for r, w in enumerate(self.rank_workers)]

    def submit(
        self, rank: int, incarnation: int, worker: str, spec: StoreSpec | None = None
    ) -> Any:
        """Submit incarnation ``incarnation`` of ``rank``, pinned to ``worker``, on
        the servers of ``spec`` (default: the run's)."""
        spec = self.spec if spec is None else spec
        task, shared = self.task, self.store is not None
        again = f"-i{incarnation}" if incarnation else ""
        return self.client.submit(
            rank_main,
            task.fn,
            spec,
            # Replicated: no actor handles as arguments (a rank reaches its servers
            # by address and key), else Dask fails the rank when one actor's worker dies.
            [] if spec.replicas > 1 else self.servers,
            rank,
            task.num_workers,
            not shared and rank == 0,
            task.args,
            task.kwargs,
            self.detail,
            incarnation,
            shared and rank == 0,
            self.topic,
            key=f"{RANK_KEY}{self.group}-{rank}{again}",
            workers=[worker],
            allow_other_workers=False,
            pure=False,
        )

    def emit(self, op: str, **fields: Any) -> None:
        """Report a run's event (a lost, replaced or dropped rank) on a shared store's bus."""
        if self.store is not None:
            self.store.events.emit(op, None, **fields)

    def open_links(self) -> None:
        """The watcher's replicated links (their failovers replay nothing), and the
        replacer of lost ranks unless a lost rank fails the run."""
        spec = self.spec
        self.links = replicated_links(spec, self.handle, None) if spec.replicas > 1 else []
        for link in self.links:
            link.failover.bind("labkv-run", spec.timeout)
        if self.on_rank_loss != "fail":
            limits = (self.max_restarts, self.replace_timeout, self.on_rank_loss == "shrink")
            self.replace = Replacer(
                spec, self.servers, self.links, self.submit, self.handle.workers, self.emit, *limits
            )

    def watch(self) -> list[Any]:
        """Wait for the ranks' results, in rank order, looking at the cluster when a
        rank ends, a rank's worker is removed, and every ``_POLL_S``."""
        self.open_links()
        self.seen = set(self.handle.workers())
        try:
            for future, worker in zip(self.futures, self.rank_workers, strict=True):
                self.wakeup.future(future)
                self.wakeup.worker(worker)
            while True:
                self.wakeup.wait(_POLL_S)
                raise_if_scheduler_gone(self.client)
                self.gather_finished()
                if len(self.results) == len(self.futures):
                    if self.replace is not None and self.replace.history:
                        _warn_if_replays_differed(self.replace)
                    return [self.results[r] for r in range(len(self.futures))]
                failed = self.failed_ranks()
                if failed:
                    self.rank_failed(failed[0])  # raises unless its loss was handled
                    continue
                died = self.check_workers()
                if died is not None:
                    self.fail(died, None)
        finally:
            self.wakeup.close()

    def gather_finished(self) -> None:
        """Gather the result of every rank that finished since the last look (a
        result lost with its worker is left to :meth:`lost_workers`)."""
        for rank, future in enumerate(self.futures):
            if rank not in self.results and future.status == "finished":
                gathered, result = _result_of(
                    future, lambda w=self.rank_workers[rank]: w in self.handle.workers()
                )
                if gathered:
                    self.results[rank] = result

    def failed_ranks(self) -> list[int]:
        """The ranks, without a result, whose task failed, was cancelled or lost."""
        return [
            r
            for r, f in enumerate(self.futures)
            if r not in self.results and f.status in ("error", "cancelled", "lost")
        ]

    def rank_failed(self, rank: int) -> None:
        """Rank ``rank``'s task failed: go on if its worker was lost and the rank
        replaced or dropped, else fail the run, naming the lost workers (they
        explain a failed rank best) or the rank and its error."""
        future = self.futures[rank]
        exc = future.exception() if future.status == "error" else None
        died = self.check_workers()
        if died is None and not self.handled(rank, future) and isinstance(exc, ServerLost):
            died = self.await_removal(rank, future)
        if self.handled(rank, future):
            return
        if died is not None:
            try:
                self.fail(died, None)
            except ClusterError as error:
                raise error from exc
        self.fail(f"rank {rank} (on {self.rank_workers[rank]}) failed ({future.status})", exc)

    def await_removal(self, rank: int, future: Any) -> str | None:
        """A rank failed by a lost server: look at the workers again for at most
        ``_REMOVAL_WAIT_S`` (the scheduler may not have removed the worker yet);
        why the run fails, or None."""
        died = None
        deadline = time.monotonic() + _REMOVAL_WAIT_S
        while time.monotonic() < deadline:
            time.sleep(_POLL_S)
            died = self.check_workers()
            if died is not None or self.handled(rank, future):
                break
        return died

    def handled(self, rank: int, future: Any) -> bool:
        """Whether the failed ``future`` of ``rank`` was replaced or dropped."""
        return self.futures[rank] is not future or rank in self.results

    def check_workers(self) -> str | None:
        """:meth:`lost_workers`, where a replacement that cannot be made fails the run."""
        try:
            return self.lost_workers()
        except ClusterError as exc:
            self.fail(str(exc), None)
            raise

    def lost_workers(self) -> str | None:
        """Why the run fails after the workers it lost (None: it lost none, or
        only ranks' workers, and their ranks were replaced or dropped)."""
        live = set(self.handle.workers())
        lost_ranks = [
            r for r, w in enumerate(self.rank_workers) if w not in live and r not in self.results
        ]
        lost_servers = self.lost_servers(live)
        if self.replace is not None and lost_ranks and not lost_servers:
            self.replace_lost(lost_ranks)
            return None
        if not (lost_ranks or lost_servers):
            return None
        addresses = self.spec.server_addresses
        gone = sorted(
            {self.rank_workers[r] for r in lost_ranks} | {addresses[s] for s in lost_servers}
        )
        return (
            f"Dask worker(s) {gone} died: ranks {lost_ranks} lost; servers {lost_servers} "
            "lost with their keys' values and optimizer states"
        )

    def lost_servers(self, live: set[str]) -> list[int]:
        """The servers lost with their values: any whose worker is not ``live``;
        with replicas, those left with no replica (a lost worker costs a failover
        and a re-seed, done here at once, so the ranks find the new primary ready)."""
        if not self.links:
            return [s for s, w in enumerate(self.spec.server_addresses) if w not in live]
        if live == self.seen:
            return []
        self.seen = set(live)
        return heal(self.handle, self.spec, self.links, self.reseeded, tuple(self.rank_workers))

    def replace_lost(self, ranks: list[int]) -> None:
        """Replace each lost rank in ``ranks`` on a free worker, or drop it
        (``"shrink"``: its result is None); its old task, pinned to a dead worker,
        never runs and is cancelled."""
        replace = self.replace
        for rank in ranks:
            busy = {
                w for r, w in enumerate(self.rank_workers) if r not in self.results and r != rank
            }
            self.client.cancel([self.futures[rank]])
            if replace.shrink:
                replace.drop(rank, self.rank_workers[rank], len(self.futures))
                self.results[rank] = None
                continue
            self.futures[rank], self.rank_workers[rank] = replace.replace(
                rank, self.rank_workers[rank], busy
            )
            self.wakeup.future(self.futures[rank])
            self.wakeup.worker(self.rank_workers[rank])

    def fail(self, reason: str, cause: BaseException | None) -> None:
        """Abort the servers (waiting ranks get ``reason`` at once), cancel the
        ranks, and raise ``cause``, or a ``ClusterError(reason)`` without one."""
        _abort(self.client, self.spec, self.servers, reason)
        self.client.cancel(self.futures)
        if cause is None:
            raise ClusterError(reason)
        raise cause

    def raise_if_scheduler_lost(self, exc: Exception) -> None:
        """Raise the lost scheduler's error if it explains ``exc`` (a broken
        connection: the client notices a moment after its calls fail)."""
        if isinstance(exc, OSError) and scheduler_gone(self.client) is None:
            time.sleep(_POLL_S)
        raise_if_scheduler_gone(self.client)

    def stop(self, exc: BaseException) -> None:
        """An interrupted run (``exc``: a Ctrl-C): stop every rank task, the
        replacements too, so that none goes on writing to the store."""
        started = self.replace.started if self.replace is not None else []
        every = [*self.futures, *(f for f, _ in started)]
        workers_of = [*self.rank_workers, *(w for _, w in started)]
        _stop_ranks(self.handle, self.spec, self.servers, every, workers_of, type(exc).__name__)

    def release(self, ok: bool) -> None:
        """Close the progress line and release what the run started: new servers
        (a shared store takes one rank again), re-seeded replicas. After a failed
        run (not ``ok``), a release that fails does not hide the run's error."""
        if self.shown is not None:
            self.shown.close()
        if scheduler_gone(self.client) is not None:  # nothing is left to release
            return
        if self.store is not None:
            try:
                self.store.configure_ranks(1)
            except Exception:
                if ok:
                    raise
        else:
            self.client.cancel(self.to_release)
        self.client.cancel(self.reseeded)
