"""The worker-side distributed store: a :class:`~labkv.store.KVStore` whose
keys live on server actors (:mod:`labkv.cluster._server.actor`) on Dask workers.

The base class normalises and validates every call; this backend turns the checked
``[(key, [arrays])]`` into one message per server per call (:mod:`.split`), sends them
(:mod:`.calls`, links of :mod:`labkv.cluster._transport`), and assembles the replies.
Choices made here, and why:

- **Small pushes are not waited for**, and held for the next pull (:mod:`.calls`, :mod:`.holding`).
- **Per-device values are summed here first** (on their device), one array per key travels.
- **Row-sparse keys move only their rows** (:mod:`labkv.cluster._rows`).
- **Only the store's owner (rank 0, or the notebook sharing its store with a run)
  initialises keys; every rank ships its updater or optimizer**, saying whether it
  is the owner (rules: :mod:`labkv.cluster._server.control`), as in MXNet. Other
  ranks' ``init`` waits until the owner's keys exist, and checks them. In a run
  on the notebook's store, rank 0 initialises the keys the notebook has not
  (``inits_new_keys``), so that a function written for a run with its own
  servers (``if kv.rank == 0: kv.init(...)``) gives the same values on both.
- **``str`` keys are numbered in init order** (:class:`._placement.KeyIds`), MXNet's
  rule; the owner's number travels with its init (a rank that differs is told).
- **Calls inside ``kv.steps`` carry the step** (:mod:`.steps`): a lost rank is replaced.
"""

from __future__ import annotations

import contextlib
import functools
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._logger import logger
from ..._types import Key
from ...events import EventBus
from ...optimizers import Optimizer
from ...sparse import is_row_sparse
from ...store import Items, KVStore
from .._errors import CallTimedOut, failed_update
from .._placement import KeyIds, Piece
from .._protocol.messages import decode_values, values_items
from .._rows.rank import new_out, pull_rows
from .._rows.row_placement import place_key
from .._transport.base import ServerLink
from . import split
from .calls import ACK_ABOVE, Calls
from .failover import ReplicatedLink
from .owner_init import heir_init, send_init, uninitialised, wait_for_owner
from .settings import Settings
from .steps import Step, StepCounter, resume_step
from .streaming import Streaming

if TYPE_CHECKING:
    from .._options import StoreSpec


def _unannounced(what: str) -> AbstractContextManager[None]:
    return contextlib.nullcontext()


class DistStore(KVStore):
    """A ``dist_*`` store: rank ``rank`` of ``num_workers`` on shared servers.

    Make one with ``labkv.create('dist_sync', cluster=handle)`` (the notebook
    is rank 0 of 1) or get one per rank from :func:`labkv.cluster.run`.
    ``servers`` are the server actors; ``links`` how this process calls them
    (:mod:`labkv.cluster._transport`; the driver builds them, see
    :func:`labkv.cluster._runtime.links.new_store`); ``handle`` the notebook's
    :class:`~labkv.cluster.ClusterHandle` (None in a rank); ``release`` stops the
    servers this store started (:meth:`close`); ``on_replica_lost(store, link,
    old)`` hears each replica a link lost.
    """

    def __init__(
        self,
        spec: StoreSpec,
        servers: list[Any],
        rank: int = 0,
        num_workers: int = 1,
        *,
        links: list[ServerLink],
        owner: bool = True,
        inits_new_keys: bool = False,
        handle: Any = None,
        release: Callable[[], None] | None = None,
        on_replica_lost: Callable[[DistStore, ReplicatedLink, str | None], None] | None = None,
        incarnation: int = 0,
        announce: Callable[[str], AbstractContextManager[None]] | None = None,
    ):
        super().__init__(spec.kind, spec.name or spec.kind)
        # what a long wait of the notebook's store says while it lasts (a rank's says nothing)
        self._announce = announce or _unannounced
        self._id = spec.store_id
        self._spec, self._servers = spec, list(servers)
        self._rank, self._num_workers, self._owner = rank, num_workers, owner
        self._inits_new_keys = inits_new_keys
        self._handle, self._release = handle, release
        self._links, self._on_replica_lost = links, on_replica_lost
        # A waited-for push that timed out: the next push, if the same, is its retry (_push_impl).
        self._timed_out: list[tuple[Key, list[Any]]] | None = None
        # A run's ranks send as "<run's barrier group>/<rank>.<incarnation>/...": a
        # stopped run's servers refuse them, and a lost rank's once it is replaced
        # (see Server.fences); the notebook's store has no prefix.
        prefix = "" if handle is not None else f"{spec.group}/{rank}.{incarnation}/"
        waits = spec.timeout + spec.replace_hold  # the servers' own waits may be held
        self._calls = Calls(links, waits, self._restore_residuals, prefix)
        self._incarnation = incarnation  # a replacement's step loops start where the rank was lost
        resume = functools.partial(resume_step, self._calls, rank) if incarnation else None
        self._steps = StepCounter(rank, spec.seed, resume)
        self._pieces: dict[Key, list[Piece]] = {}
        self._ids = KeyIds()  # str keys numbered in this process's init order, as MXNet
        self._barriers = 0  # how many barriers this rank entered (numbered by self._steps)
        owns = owner and not incarnation  # a replacement's equal settings change nothing
        parts = (self._calls, spec, self._meta, self._pieces)
        self._settings = Settings(*parts, owner=owns, rank=rank)
        # The notebook's store: its events come from the servers, while watched.
        streams = Streaming(handle.client, self._id, self._calls, spec.timeout) if handle else None
        self._streaming = streams
        self.events = EventBus(self._id) if self._streaming is None else self._streaming.bus
        hooks = (self._failed_over, self._promoted, True)  # pulls are near reads where they can be
        for link in links:
            link.failover.bind(self._calls.sender, spec.timeout, *hooks)

    # -- identity ----------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This worker's rank among the store's ``num_workers``."""
        return self._rank

    @property
    def incarnation(self) -> int:
        """How many times this rank was replaced before (0: the first; see
        ``run(..., on_rank_loss="replace")``)."""
        return self._incarnation

    def steps(self, n: int, seed: int | None = None) -> Iterator[Step]:
        """The training loop's steps, ``for step in kv.steps(n):``, each a
        :class:`~labkv.cluster.Step` (``step.index``, and ``step.rng`` seeded
        by ``(seed, rank, step)``; ``seed`` defaults to the run's). A rank lost
        mid-run is replaced at the step it was lost in, which it replays
        (``run(..., on_rank_loss="replace")``, ``docs/cluster.md``): keep what
        a step needs in the store or in ``step``, not in variables across steps.

        >>> for step in kv.steps(3):  # doctest: +SKIP
        ...     w = kv.pull("w")
        ...     kv.push("w", grad(w, batch_of(step.index), step.rng))
        """
        return self._steps.loop(n, seed)

    @property
    def num_workers(self) -> int:
        """How many ranks push to the servers (a dist_sync round waits for all)."""
        return self._num_workers

    @property
    def staleness(self) -> int | None:
        """dist_ssp: how many rounds a rank may run ahead of the slowest rank
        (a pull at clock c waits until every rank has pushed c - staleness
        times); None for the other types.

        >>> labkv.create("dist_ssp", staleness=2).staleness  # doctest: +SKIP
        2
        """
        return self._spec.staleness

    @property
    def num_servers(self) -> int:
        """How many server shards hold the keys."""
        return self._spec.num_servers

    def __repr__(self) -> str:
        return (
            f"<labkv.KVStore type={self._type!r} rank={self._rank}/{self._num_workers} "
            f"servers={self.num_servers} keys={len(self._meta)} id={self._id}>"
        )

    @property
    def store_id(self) -> str:
        """The store's id: its servers' Dask keys and its event topic carry it."""
        return self._id

    @property
    def spec(self) -> StoreSpec:
        """What a rank needs to reach this store's servers (with :attr:`servers`)."""
        return self._spec

    @property
    def servers(self) -> list[Any]:
        """The server actors (Dask ``Actor`` handles), by server id."""
        return list(self._servers)

    @property
    def handle(self) -> Any:
        """The cluster handle of a store made in this process (None in a rank)."""
        return self._handle

    def _local_server(self, s: int) -> Any:
        """Server ``s`` itself when this process calls it in-process (a rank on
        the server's worker), else None."""
        return self._links[s].local

    def configure_ranks(self, num_workers: int) -> None:
        """Tell every server how many ranks a dist_sync round waits for (a run
        sharing this store sets its ranks, then 1 again); no round may be open."""
        self._calls.all("configure", num_workers)

    def flush(self) -> None:
        """Wait for this rank's pushes still in flight (raising their errors)."""
        self._calls.flush()

    # -- replicas --------------------------------------------------------------------------
    def _promoted(self, link: ReplicatedLink) -> None:
        if self._streaming is not None:
            self._streaming.promoted(link.primary)

    def _failed_over(self, link: ReplicatedLink, old: str | None) -> None:
        """Server ``link.sid`` lost a replica: its link made the next one the
        primary (``old``: the lost primary's worker), or learnt that a backup is
        gone (``old`` None). Reported on ``events``; ``on_replica_lost`` (the
        driver's, see :func:`labkv.cluster._runtime.reseed.replica_lost`) may
        start a new replica; the spec then names the replicas of now, so that a
        run sharing the store reaches them."""
        if old is not None:
            if self._streaming is not None:
                self._streaming.failed_over()
            extra = {"lost": [old], "replicas": link.failover.replicas(), "primary": link.address}
            extra["promoted"] = True
            logger.warning(
                "store %s, rank %d: server %d's primary on %s was lost; %s is its primary now "
                "(replicas %s)",
                self._id,
                self._rank,
                link.sid,
                old,
                link.address,
                ", ".join(link.failover.replicas()),
            )
            self.events.emit("failover", None, rank=self._rank, server=link.sid, extra=extra)
        if self._on_replica_lost is not None:  # the driver starts a replica in its place
            self._on_replica_lost(self, link, old)
        self._spec.replica_members[link.sid] = [tuple(m) for m in link.members]

    # -- updaters, optimizers and their states (see settings.py) ------------------------------
    def _set_updater_impl(self, updater: Callable) -> None:
        self._settings.set_updater(updater)

    def _set_optimizer_impl(self, optimizer: Optimizer) -> None:
        self._settings.set_optimizer(optimizer)

    def _optimizer_states(self) -> tuple[int, dict, dict]:
        with self._announce(f"reading the optimizer states of {self.num_servers} servers"):
            return self._settings.optimizer_states()

    def _load_optimizer_states(self, num_update: int, counts: dict, states: dict) -> None:
        with self._announce(f"loading optimizer states into {self.num_servers} servers"):
            self._settings.load_optimizer_states(num_update, counts, states)

    def _residuals_committed(self, replaced: dict) -> None:
        self._settings.residuals_committed(replaced)

    def _restore_residuals(self, exc: BaseException) -> None:
        self._settings.restore_residuals(exc, self._compression)

    # -- keys ------------------------------------------------------------------------
    def _place(self, key_id: int, shape: tuple, sparse: bool = False) -> list[Piece]:
        return place_key(key_id, shape, sparse, self.num_servers, self._spec.bigarray_bound)

    def _learn(self, key: Key, meta: Any) -> None:
        """A key this rank never initialised: placed by the id its owner gave it."""
        self._ids.adopt(key, meta.key_id)
        self._pieces[key] = self._place(meta.key_id, tuple(meta.shape), meta.sparse)
        self._meta[key] = (tuple(meta.shape), np.dtype(meta.dtype))
        self._sparse.update([key] if meta.sparse else [])
        if self._key_kind is None:
            self._key_kind = type(key)

    def _check_known(self, keys: list[Key]) -> None:
        # A key another rank (or the notebook) initialised is known to the
        # servers but not yet to this rank: ask them once, on this miss path only.
        self._check_key_kinds(keys)
        unknown = [k for k in keys if k not in self._meta]
        if unknown:
            for found in self._calls.all("keys", unknown):
                for k, meta in found.items():
                    if k not in self._meta:
                        self._learn(k, meta)
        if self._handle is None:  # a rank of a run: say which, and who initialises
            for key in keys:
                if key not in self._meta:
                    raise KeyError(uninitialised(key, self._rank))
        super()._check_known(keys)

    def _init_impl(self, items: list[tuple[Key, Any]]) -> None:
        keys = [k for k, _ in items]
        ids = dict(zip(keys, self._ids.proposed(keys), strict=True))
        placed = {k: self._place(ids[k], tuple(a.shape), is_row_sparse(a)) for k, a in items}
        self._settings.check_updater(self._updater, placed)
        mib = sum(int(getattr(a, "nbytes", 0)) for _, a in items) / 2**20
        with self._announce(
            f"initialising {len(items)} keys ({mib:.1f} MiB) on {self.num_servers} servers"
        ):
            self._init_placed(items, ids, placed)

    def _init_placed(self, items: list[tuple[Key, Any]], ids: dict, placed: dict) -> None:
        keys = [k for k, _ in items]
        if (self._owner and self._incarnation) or self._inits_new_keys:
            # a replacement (its lost one's keys are there), or rank 0 on the
            # notebook's store (the notebook's are): those checked, the others sent
            heir_init(self._calls, items, ids, placed)
        elif self._owner:
            send_init(self._calls, items, ids, placed)
        else:
            wait_for_owner(self._calls, items, ids, placed)
        self._ids.assign(keys)
        self._pieces.update(placed)

    # -- push and pull -------------------------------------------------------------
    def _push_impl(self, items: Items) -> None:
        calls = self._calls
        timed_out, self._timed_out = self._timed_out, None
        if timed_out is not None and split.same_push(timed_out, items):
            calls.settle()  # a retry: the push that timed out is the one applied
            return
        calls.reap()
        compression, meta, pieces = self._compression, self._meta, self._pieces
        per_server, nbytes = split.per_server(items, meta, pieces, compression, self._sparse)
        wait = nbytes >= ACK_ABOVE
        links = self._links
        # A replicated dist_sync push is kept until its round is acknowledged, after
        # the push returns: a big one lent to the server is copied to be kept.
        keep_copies = self._spec.replicas > 1 and self._spec.sync
        step = self._steps.pushing
        if step is not None:
            self._steps.pushed.update(k for k, _ in items)
        with calls.sending("push"):  # numbers taken are numbers sent, Ctrl-C or not
            msgs = []
            for s, batch in per_server.items():
                header = (calls.sender, self._rank, calls.next_seq(s))
                same_process = links[s].local is not None
                msg = split.push_message(
                    header, batch, meta, not wait, same_process, compression, step
                )
                msgs.append((s, msg))
            sent = calls.send_pushes(msgs, wait, keep_copies)
        try:
            calls.finish_pushes(sent, wait)
        except CallTimedOut:  # sent: it may still be applied
            self._timed_out = split.kept_push(items)  # dense or row-sparse
            raise

    def _pull_impl(self, items: Items) -> None:
        self._timed_out = None  # only the very next push may be a retry
        for step, group in self._steps.reads(items, key=lambda item: item[0]):
            self._pull_as_of(group, step)

    def _pull_as_of(self, items: Items, step: int | None) -> None:
        per_server: dict[int, dict[Key, None]] = defaultdict(dict)  # ordered sets
        for key, _ in items:
            for p in self._pieces[key]:
                per_server[p.server][key] = None
        keys = {s: list(ks) for s, ks in per_server.items()}
        got: dict[tuple[int, Key], Any] = {}
        replies = self._calls.pull(keys, self._rank, step)
        for (s, ks), reply in zip(keys.items(), replies, strict=True):
            lookup = functools.partial(split.piece_spec, self._meta, self._pieces, s)
            for key, value in values_items(ks, decode_values(reply), lookup):
                got[(s, key)] = value
        split.fill_outs(items, got, self._meta, self._pieces)

    def _pull_rows(self, items: list[tuple[Key, np.ndarray]]) -> list[np.ndarray]:
        got = {}
        for step, group in self._steps.reads(list(range(len(items))), key=lambda i: items[i][0]):
            args = (self._calls, self._meta, self._pieces, [items[i] for i in group], self._rank)
            # each server asked only for its rows (labkv.cluster._rows)
            got.update(zip(group, pull_rows(*args, step, self), strict=True))
        return [got[i] for i in range(len(items))]

    def _new_out(self, key: Key) -> Any:
        return new_out(*self._meta[key], key in self._sparse)

    def peek(self, key: Key) -> np.ndarray:
        """``key``'s value (dense) as the servers hold it now, without a pull: no
        event, no waiting for a round, safe from another thread (a monitor's); in
        dist_sync maybe a round behind what a pull after a push returns.

        >>> kv.peek("w")  # doctest: +SKIP
        array([3., 3., 3.], dtype=float32)
        """
        self._check_known([key])
        pieces = self._pieces[key]
        calls = [(p.server, self._calls.call(p.server, "peek", [key])) for p in pieces]
        values = [reply[0] for reply in self._calls.wait(calls, "peek")]
        return split.join(values, *self._meta[key])

    # -- barrier, placement, events ------------------------------------------------------
    def _barrier_impl(self) -> None:
        self._timed_out = None
        failed = None
        try:
            self.flush()
        except Exception as exc:
            if failed_update(exc) is None:
                raise  # a lost server or a timeout: this rank cannot go on
            # An updater refused a push of this rank: it still enters the barrier
            # (the others must not wait for it), then raises the error once.
            failed = exc
        generation, self._barriers = self._steps.barrier(), self._barriers + 1
        if self._num_workers > 1:  # held on server 0, the answer once every rank entered
            args = (self._spec.group, self._rank, generation, self._num_workers)
            self._calls.wait([(0, self._calls.call(0, "barrier", *args))], "barrier")
        if failed is not None:
            raise failed

    def placement(self) -> dict[Key, list[dict[str, Any]]]:
        """Where every key lives, in the local store's format: per key, its
        pieces ``{'server': s, 'device': 'cpu(0)@<worker address>', 'start': a,
        'stop': b, 'replicas': [<worker address>, ...]}`` (flat element offsets;
        one piece, or one slice per server from ``bigarray_bound`` elements;
        ``replicas``: the piece's workers, primary first). A value below
        ``bigarray_bound`` lives on server ``(id * 9973) % num_servers``, a str
        key's id its position in init order (:mod:`labkv.cluster._placement`).

        >>> kv.init(["W1", "b1"], [np.zeros(4), np.zeros(2)])  # doctest: +SKIP
        >>> [kv.placement()[k][0]["server"] for k in ["W1", "b1"]]  # doctest: +SKIP
        [0, 1]
        """
        return split.placement_table(
            self._pieces, self._meta, self._spec.server_devices, self._links
        )

    def server_load(self) -> list[dict[str, Any]]:
        """Per server: its device, bytes in/out so far, keys, bytes held, split."""
        return self._calls.all("load")

    def close(self) -> None:
        """Release the servers this store started (their keys are dropped); a
        later call on the store raises ``ClusterError`` saying it is closed."""
        if self._release is not None and self._streaming is not None:
            self._calls.closed = f"the store {self._id} is closed (its servers were released)"
            release, self._release = self._release, None
            self._streaming.close(release)

    def __enter__(self) -> DistStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
