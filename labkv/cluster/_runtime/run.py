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
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..._types import SYNC_KINDS, dist_kind
from .. import _event_relay
from .._device import parse_server_device
from .._errors import ClusterError
from .._event_relay import EventStream, rank_detail, topic_of
from .._options import (
    DEFAULT_TIMEOUT_S,
    StoreSpec,
    check_replicas,
    check_staleness,
)
from .._placement import DEFAULT_BIGARRAY_BOUND
from .._rank.dist_store import DistStore
from .._transport.dask import worker_loop
from .._transport.scheduler import raise_if_scheduler_gone, scheduler_gone
from .compat import check_cluster
from .connect import ClusterHandle, default_handle
from .elastic import Replacer, check_on_rank_loss, check_shrink
from .launch import check_cluster_args, start_servers
from .links import new_store
from .needs import modules_needed
from .progress import Progress, progress_topic, step_reporter
from .waits import progress_on
from .watch import _POLL_S, _stop_ranks, _watch

# A call onto the rank's own worker loop (never waits on another process).
_LOOP_CALL_S = 10.0


def _rank_main(
    fn: Callable,
    spec: StoreSpec,
    servers: list[Any],
    rank: int,
    num_workers: int,
    owner: bool,
    args: tuple,
    kwargs: dict,
    detail: tuple[float, int] | None = None,
    incarnation: int = 0,
    inits_new_keys: bool = False,
    progress: str | None = None,
) -> Any:
    """The task of one rank (its ``incarnation``-th replacement, 0: the first):
    build its store, run ``fn``, wait for its pushes. With ``detail`` (the
    notebook's subscribers' ``(detail_interval, detail_burst)``), the rank's
    events go to the store's topic meanwhile; ``inits_new_keys``: rank 0 of a
    run on the notebook's store (it initialises the keys the notebook has not)."""
    _quiet_rank_failures()
    kv = new_store(
        spec,
        servers,
        rank,
        num_workers,
        owner=owner,
        inits_new_keys=inits_new_keys,
        incarnation=incarnation,
    )
    if progress is not None:  # the run's topic of the ranks' steps
        kv._steps.hooks.append(step_reporter(rank, progress, kv._steps))
    stop_stream = _stream_events(kv, *detail) if detail is not None else None
    try:
        result = fn(kv, *args, **kwargs)
        kv.flush()
    finally:
        if stop_stream is not None:
            # Events are best effort: the rank's own outcome (or error) is what counts.
            with contextlib.suppress(Exception):
                stop_stream()
    return result


_RANK_KEY = "labkv-rank-"  # the Dask key of every rank task starts with it


class _RankFailureFilter(logging.Filter):
    """Drops the worker's "Compute Failed" record of a rank task: ``run`` raises that
    error in the caller, naming the rank; Dask's record would print it again, as an
    escaped one-line traceback, under whichever notebook cell is running."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not (msg.startswith("Compute Failed") and _RANK_KEY in str(record.args))


def _quiet_rank_failures() -> None:
    """Install :class:`_RankFailureFilter` on this worker's logger, once."""
    logger = logging.getLogger("distributed.worker")
    if not any(isinstance(f, _RankFailureFilter) for f in logger.filters):
        logger.addFilter(_RankFailureFilter())


def _stream_events(kv: DistStore, detail_interval: float, detail_burst: int) -> Callable[[], None]:
    """Send a rank's events to its store's topic, batched on the worker's loop
    (as a server's are); returns the function that sends the rest and stops."""
    from distributed import get_worker

    worker = get_worker()
    topic = topic_of(kv.store_id)

    def send(batch: bytes) -> None:
        worker.log_event(topic, batch)

    stream = EventStream(kv.events, send, interval=_event_relay.RANK_FLUSH_S)
    loop = worker_loop(worker)

    async def start() -> None:
        stream.start(detail_interval, detail_burst)

    async def stop() -> None:
        stream.stop()

    asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=_LOOP_CALL_S)
    return lambda: asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=_LOOP_CALL_S)


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
    client = handle.client
    group = f"labkv-barrier-{uuid.uuid4().hex[:8]}"
    futures_to_release = None
    reseeded: list[Any] = []  # replicas started after a loss, released with the run's
    if shared:
        kvstore.flush()
        spec, servers = kvstore.spec, kvstore.servers
        kvstore.configure_ranks(num_workers)
    else:
        num_servers = num_servers or num_workers
        try:
            futures_to_release, servers, spec = start_servers(
                handle,
                kind,
                num_servers,
                num_workers,
                timeout,
                workers,
                server_device,
                bigarray_bound,
                name=kvstore.lower(),
                staleness=staleness,
                replicas=replicas,
            )
        except Exception:  # Dask's "futures cancelled": a lost scheduler explains it best
            raise_if_scheduler_gone(client)
            raise
    hold = replace_timeout if on_rank_loss == "replace" else 0.0
    # this run's own barrier group; its ranks wait for a replacement as the servers do
    spec = dataclasses.replace(spec, group=group, seed=int(seed), replace_hold=hold)
    rank_workers = workers[:num_workers]
    # The notebook watches the shared store: the ranks stream their own events too.
    watched = shared and kvstore.events.active
    detail = rank_detail(kvstore.events, num_workers) if watched else None

    def submit(rank: int, incarnation: int, worker: str, spec: StoreSpec = spec) -> Any:
        again = f"-i{incarnation}" if incarnation else ""
        return client.submit(
            _rank_main,
            fn,
            spec,
            # Replicated: no actor handles as arguments (a rank reaches its servers
            # by address and key), else Dask fails the rank when one actor's worker dies.
            [] if spec.replicas > 1 else servers,
            rank,
            num_workers,
            not shared and rank == 0,
            tuple(args),
            kwargs,
            detail,
            incarnation,
            shared and rank == 0,
            topic,
            key=f"{_RANK_KEY}{group}-{rank}{again}",
            workers=[worker],
            allow_other_workers=False,
            pure=False,
        )

    def emit(op: str, **fields: Any) -> None:
        if shared:
            kvstore.events.emit(op, None, **fields)

    made: list[Replacer] = []  # the watcher's, whose replacements a Ctrl-C stops too

    def replacer(links: list[Any]) -> Replacer:
        limits = (max_restarts, replace_timeout, on_rank_loss == "shrink")
        made.append(Replacer(spec, servers, links, submit, handle.workers, emit, *limits))
        return made[-1]

    if progress is None:
        progress = progress_on()
    topic = progress_topic(group) if progress else None
    shown = Progress(client, topic, num_workers).start() if topic is not None else None
    futures = [submit(rank, 0, rank_workers[rank]) for rank in range(num_workers)]
    replace = replacer if on_rank_loss != "fail" else None
    ok = False
    try:
        with client.as_current():  # distributed.wait looks for "the current client"
            out = _watch(handle, futures, rank_workers, spec, servers, reseeded, replace)
        ok = True
    except ClusterError:
        raise
    except Exception as exc:  # a broken connection: a lost scheduler explains it best
        if isinstance(exc, OSError) and scheduler_gone(client) is None:
            time.sleep(_POLL_S)  # the client notices a moment after its calls fail
        raise_if_scheduler_gone(client)
        raise
    except BaseException as exc:  # Ctrl-C: no rank may go on writing to the store
        started = [fw for r in made for fw in r.started]
        every = [*futures, *(f for f, _ in started)]
        workers_of = [*rank_workers, *(w for _, w in started)]
        _stop_ranks(handle, spec, servers, every, workers_of, type(exc).__name__)
        raise
    finally:
        if shown is not None:
            shown.close()
        if scheduler_gone(client) is None:  # else nothing is left to release
            if shared:
                try:
                    kvstore.configure_ranks(1)
                except Exception:
                    if ok:
                        raise
            else:
                client.cancel(futures_to_release)
            client.cancel(reseeded)
    return out
