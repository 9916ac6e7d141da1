"""A server shard: one Dask actor holding its keys in a :class:`~labkv.shard.Shard`.

Every method is ``async def``. A Dask worker runs the *sync* methods of all
its actors on one thread, so a server that blocked while waiting for the
other ranks' pushes would stall every other shard on that worker (and two
shards waiting for each other's rounds would deadlock). ``async`` methods run
on the worker's event loop instead: a wait is an ``await`` on the server's
future (see :mod:`labkv.cluster._server.waiting`), and the loop serves other calls meanwhile. Update
arithmetic (``Shard.apply``) runs inline on the loop: it is short and never waits.

Ordering: a rank's pushes may travel on different connections, so each push
carries a per-(sender, server) sequence number and the server applies a
sender's pushes in that order. A pull carries the number of pushes the sender
has sent to this server and first waits for them, so a rank can send a push
without waiting for its reply and still read its own write.

dist_ssp clocks (:class:`~labkv.cluster._server.clocks.Clocks`): pushes are applied as in
dist_async and advance the pushing rank's clock of their keys; a pull waits
until every rank's clock is within the staleness bound of the puller's.

dist_sync rounds: per key, the server collects one push per rank; the W-th
completes the round, the sum goes through ``Shard.apply`` once, and the
round counter advances. A rank's pull waits for the round its last push
joined; a sender that never pushed the key (the notebook watching) gets the
last completed value at once.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from ...compression import from_wire
from ...devices import copy_into, empty, to_device
from ...events import EventBus
from ...reduce import sum_into
from ...shard import Shard, check_new_keys
from .._device import (
    device_label,
    host_copy,
    host_view,
    packed_on_host,
    pick_server_device,
    warm_up,
)
from .._errors import ClusterError, answered
from .._events import EventStream
from .._placement import ORDER_RULE
from .._protocol.messages import (
    Codes,
    InitItem,
    KeyMeta,
    Pull,
    Push,
    decode_pull,
    decode_push,
    encode,
    pack_values,
    push_items,
)
from .._protocol.packing import PACK_BELOW
from .._transport.base import Host
from .._transport.dask import DaskHost
from .clocks import Clocks
from .control import ServerControl
from .order import UpdateQueue
from .replication.log import Replication
from .reports import ServerEvents
from .rounds import Failure, SyncRounds
from .updates import Updates
from .waiting import Waiters

Key = int | str

# Values smaller than this are copied before they are returned by a pull: the
# reply is serialised after the method returns, and an unrelated push could
# change the stored array in between. Big values of a rank's own sync round are
# sent without a copy (no push can change them before that rank pushes again).
_COPY_BELOW = 1 << 20


class Server(Updates, Replication, ServerEvents, ServerControl):
    """The server actor (see module doc); made by :func:`labkv.cluster._runtime.launch.start_servers`."""

    sid: int = 0  # declared on the class so that remote attribute reads work
    device_name: str = "cpu(0)"

    def __init__(
        self,
        sid: int,
        store_id: str,
        num_workers: int,
        sync: bool,
        timeout: float,
        topic: str,
        device: str = "cpu",
        staleness: int | None = None,
        host: Host | None = None,
    ):
        host = DaskHost() if host is None else host
        self.device = pick_server_device(device, sid, f"Dask worker {host.address}")
        self.device_name = device_label(self.device)
        warm_up(self.device)  # first-use kernel compiles now, not inside the first push
        self.sid, self.store_id = sid, store_id
        self.sync, self.timeout, self.topic = sync, timeout, topic
        self.bus = EventBus(store_id)
        self.shard = Shard(self.bus, server=sid)
        self.meta: dict[Key, tuple[tuple[int, ...], str]] = {}
        self.first_piece: dict[Key, bool] = {}
        self.rounds = SyncRounds(num_workers)
        # Keys cut into slices (one per server) and the servers of this store
        # ``(worker address, actor key)``: a sliced key's update commits on every
        # server or none, so the servers vote on each one (see _vote).
        self.sliced: set[Key] = set()
        self.peers: list[tuple[str, str]] = []
        self._votes: dict[tuple[Key, int], dict[int, BaseException | None]] = {}
        # replicated: this server's votes of the last two updates of each key
        self._my_votes: dict[Key, dict[int, tuple[BaseException | None, tuple | None]]] = {}
        self._prepared: dict[tuple[Key, int], tuple[Any, Failure | None, dict]] = {}
        self.queues: dict[Key, UpdateQueue] = {}  # dist_async: sliced keys' updates in order
        self._tasks: set[asyncio.Future] = set()
        self.next_seq: dict[str, int] = {}
        self._stage: dict[tuple[Key, int], Any] = {}
        self.bytes_in = self.bytes_out = 0
        self.messages = {"push": 0, "pull": 0}
        # Waiting for state changes: each wait re-checks after every _wake().
        self.waiting = Waiters(f"server {sid}", timeout)
        self._wait, self._wake = self.waiting.until, self.waiting.wake
        self.address, self.host = host.address, host
        # dist_ssp: per-key clocks of the ranks, and each sender's rank (a pull names its sender)
        self.clocks = None if staleness is None else Clocks(staleness, num_workers)
        self.rank_of: dict[str, int] = {}
        # Sender prefixes of the runs aborted on this server (a rank's sender starts
        # with its run's barrier group): their ranks' calls are refused for good.
        self.barred: tuple[str, ...] = ()
        self.stream = EventStream(
            self.bus,
            lambda batch: host.log_event(self.topic, batch),
            self._load,
            annotate=self._annotate,
        )

    # -- waiting ---------------------------------------------------------------

    async def _pushes_arrived(self, sender: str, seq: int, who: str) -> None:
        """Wait until ``sender``'s first ``seq`` pushes have been applied here
        (they may travel on other connections than the call that waits)."""
        if self.next_seq.get(sender, 0) < seq:
            await self._wait(
                lambda: self.next_seq.get(sender, 0) >= seq,
                lambda: f"push #{self.next_seq.get(sender, 0)} from {who} never arrived",
            )

    @property
    def num_workers(self) -> int:
        """How many ranks a dist_sync round waits for."""
        return self.rounds.num_workers

    def _missing_ranks(self, key: Key) -> str:
        r = self.rounds[key]
        if not r.missing(self.num_workers) and (key, r.done) in self._prepared:
            return self._missing_votes(key)
        return self.rounds.missing(key)

    # -- keys -------------------------------------------------------------------
    @answered
    async def init(self, items: list[InitItem]) -> None:
        """Store new keys, one :class:`~labkv.cluster._protocol.messages.InitItem` each."""
        items = [InitItem._make(item) for item in items]
        check_new_keys([item.key for item in items], self.meta)
        for item in items:
            key, piece, shape = item.key, item.piece, item.shape
            self.shard.init(key, to_device(np.asarray(piece, dtype=item.dtype), self.device))
            self.meta[key] = KeyMeta(tuple(shape), item.dtype, item.key_id)
            # A whole value, or slice 0 of a sliced one (slice s lives on server s): the
            # piece whose receipt stands for the push, so views count each push once.
            whole = piece.size == int(np.prod(shape))
            self.first_piece[key] = self.sid == 0 or whole
            if not whole:
                self.sliced.add(key)
            self.rounds.add(key)
            self.bytes_in += piece.nbytes
        self._wake()

    @answered
    async def keys(self, wanted: list[Key] | None = None) -> dict[Key, KeyMeta]:
        """``{key: KeyMeta}`` of the wanted keys that exist (all with None)."""
        if wanted is None:
            return dict(self.meta)
        return {k: self.meta[k] for k in wanted if k in self.meta}

    @answered
    async def wait_keys(self, wanted: list[Key]) -> dict[Key, KeyMeta]:
        """Wait until every wanted key is initialised (by rank 0); their metadata."""
        await self._wait(lambda: all(k in self.meta for k in wanted), lambda: self._never(wanted))
        return {k: self.meta[k] for k in wanted}

    def _never(self, wanted: list[Key]) -> str:
        """Why ``wait_keys(wanted)`` timed out."""
        missing = [k for k in wanted if k not in self.meta]
        why = f"keys {missing} were never initialised (rank 0 has not called init for them"
        if any(isinstance(k, str) for k in missing):
            # A rank whose order differs places the key elsewhere and waits here in vain.
            why += f", or initialised them in another order, on another server; {ORDER_RULE}"
        return why + ")"

    def _barred_error(self, rank: int | None) -> ClusterError:
        who = "a rank" if rank is None else f"rank {rank}"
        return ClusterError(
            f"server {self.sid} refuses {who} of a run that was stopped (interrupted, or a "
            "rank failed): that run's ranks may not change the store any more"
        )

    # -- push and pull ----------------------------------------------------------
    @answered
    async def push(self, msg: Push | tuple | bytes) -> tuple | None:
        """One :class:`~labkv.cluster._protocol.messages.Push` (as :func:`~labkv.cluster._protocol.messages.encode` made it): the
        ``seq``-th push of ``sender``, its values read with this server's piece
        shapes (see :func:`~labkv.cluster._protocol.messages.push_items`). ``borrowed``: the big arrays
        are the caller's own (a rank on this worker, which may reuse them at once)."""
        push = decode_push(msg)
        h = push.header
        sender, rank, seq, keys, codes = h.sender, h.rank, h.seq, h.keys, h.codes
        if self.barred and sender.startswith(self.barred):
            raise self._barred_error(rank)
        borrowed = h.borrowed and bool(h.big)
        self.messages["push"] += 1
        await self._pushes_arrived(sender, seq, f"rank {rank}")
        try:
            values = self.shard.values
            for key in keys:
                if key not in values:
                    raise KeyError(f"key {key!r} is not initialised on server {self.sid}")
            items = push_items(push, self._piece_spec)
            self.bytes_in += sum(v.nbytes for _, v in items)  # as they travelled
            if self.group is not None:  # a resend after a failover is applied once
                items = [(k, v) for k, v in items if not self._already_applied(sender, k, seq)]
            if codes is not None:
                items = self._decompressed(items, codes)
            if self.sync:
                await self._push_sync(sender, rank, seq, items, borrowed)
            else:
                if self.bus.active:
                    for key, value in items:
                        self._emit_receipt(key, value, rank)
                queued = []
                if self.shard.updater is not None:  # sliced keys: see _queue_update
                    queued = [(k, v) for k, v in items if k in self.sliced]
                    items = [(k, v) for k, v in items if k not in self.sliced]
                    for key, value in queued:
                        self._queue_update(sender, seq, key, value)
                try:
                    if self.group is None:
                        self.shard.apply([(k, [v]) for k, v in items])
                    else:
                        self._issue_push(sender, seq, items, rank)
                except Exception as exc:
                    keys = [k for k, _ in items]
                    failure = self._failure(exc, keys, {sender: dict.fromkeys(keys, seq)})
                    raise failure.report_to(sender) from None
                finally:
                    await self._updates_decided(sender, [k for k, _ in queued])
        finally:
            if self.clocks is not None and self.group is None:  # replicated: see _issue_push
                self._ticked(sender, rank, keys)
            if self.next_seq.get(sender, 0) <= seq:  # a resend may come after later pushes
                self.next_seq[sender] = seq + 1
            self._wake()
        if self.group is not None:
            if h.big:  # the rank waits for this push: acknowledge it at once
                await self._replicated()
            return self._reply(sender)
        return None

    def _piece_spec(self, key: Key) -> tuple[Any, tuple[int, ...]]:
        """``(dtype, shape)`` of the stored piece of ``key``."""
        value = self.shard.values[key]
        return value.dtype, value.shape

    def _decompressed(self, items: list[tuple[Key, Any]], codes: Codes) -> list[tuple[Key, Any]]:
        """A compressed push's values: each device's codes unpacked and summed, in
        the rank's order and precision (so the result is bit-exact with a push of
        the same values uncompressed)."""
        kind, threshold = codes.kind, codes.threshold
        result = []
        for key, packed in items:
            stored = self.shard.values[key]
            per_device = from_wire(kind, threshold, packed, stored.size)
            value = np.empty(stored.shape, np.float32)
            sum_into(value, [v.reshape(stored.shape) for v in per_device])
            result.append((key, value))
        return result

    async def _push_sync(
        self, sender: str, rank: int, seq: int, items: list[tuple[Key, Any]], borrowed: bool
    ) -> None:
        complete = []
        rounds = self.rounds
        for key, value in items:
            if rounds.ahead(key, rank):  # this rank is a round ahead: wait for the others
                await self._wait(
                    lambda k=key: not rounds.ahead(k, rank), lambda k=key: self._missing_ranks(k)
                )
            # A borrowed value that completes its round is summed before this push
            # returns: only one that waits for other ranks needs a copy of its own.
            if borrowed and value.nbytes >= PACK_BELOW and not rounds.completes(key):
                value = self._staged(key, rank, value)
            completed = rounds.join(key, rank, sender, seq, value, time.monotonic())
            if self.bus.active:
                self._emit_receipt(key, value, rank)
                self._emit_round(key, rounds[key])
            if completed:
                complete.append(key)
        if complete:
            self._complete(complete, sender)

    def _staged(self, key: Key, rank: int, value: Any) -> Any:
        """A copy of a borrowed value, in this rank's staging buffer for ``key``:
        free again, since the rank's previous value of the key was applied when
        its round completed (a rank has at most one value pending per key)."""
        stage = self._stage.get((key, rank))
        if stage is None or stage.shape != value.shape or stage.dtype != value.dtype:
            stage = self._stage[(key, rank)] = empty(value.shape, value.dtype, self.device)
        copy_into(stage, value)
        return stage

    # -- dist_async updates of sliced keys ---------------------------------------------

    # -- dist_ssp clocks ----------------------------------------------------------------
    def _ticked(self, sender: str, rank: int, keys: list[Key]) -> None:
        """``rank``'s push of ``keys`` is applied (or failed: it still counts, so
        that no other rank waits for it forever): advance its clocks."""
        self.rank_of[sender] = rank
        self.clocks.tick(rank, [k for k in keys if k in self.meta])

    async def _within_staleness(self, sender: str, keys: list[Key]) -> None:
        """Wait until every rank is within the staleness bound of ``sender``'s
        clock of each key (a sender that never pushed here does not wait);
        with events on, report each key's clocks and how long the pull waited."""
        rank = self.rank_of.get(sender)
        if rank is None:
            return
        clocks, watched = self.clocks, self.bus.active
        for key in keys:
            start = time.monotonic() if watched else 0.0
            if not clocks.ready(key, rank):
                await self._wait(
                    lambda k=key: clocks.ready(k, rank), lambda k=key: clocks.behind(k, rank)
                )
            if watched and self.first_piece.get(key, True):
                self._emit_clocks(key, rank, time.monotonic() - start)

    @answered
    async def pull(self, msg: Pull | tuple | bytes) -> tuple | bytes:
        """The values of ``keys`` after this sender's first ``seq`` pushes (and,
        in dist_sync, after the rounds those pushes joined) have been applied
        (a :class:`~labkv.cluster._protocol.messages.Pull`). Its ``pushes``, held back by the sender
        (see :mod:`labkv.cluster._rank.holding`), are applied first, in order, each as
        :meth:`push` would (all of them, even after one failed; the first error
        is then this call's). Returns the encoded :class:`~labkv.cluster._protocol.messages.Values`."""
        pull = decode_pull(msg)
        sender, seq, keys = pull.sender, pull.seq, pull.keys
        if self.barred and sender.startswith(self.barred):
            raise self._barred_error(None)
        error = None
        for push in pull.pushes:
            try:
                await self.push(push)
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error
        self.messages["pull"] += 1
        await self._pushes_arrived(sender, seq, "this worker")
        if self.clocks is not None:
            await self._within_staleness(sender, keys)
        own_round = set()
        if self.sync:
            rounds = self.rounds
            for key in keys:
                if not rounds.pushed(sender, key):
                    continue
                if not rounds.pull_ready(sender, key):
                    await self._wait(
                        lambda k=key: rounds.pull_ready(sender, k),
                        lambda k=key: self._missing_ranks(k),
                    )
                own_round.add(key)
        for key in keys:  # an update that failed reaches each rank once
            failed = self.rounds[key].report_to(sender)
            if failed is not None:
                if self.group is not None:  # the backups cross it off too
                    self._issue_told(sender, [key])
                raise failed
        if self.group is not None:
            await self._replicated()
        values = [self.shard.read(key) for key in keys]
        self.bytes_out += sum(v.nbytes for v in values)
        # Small values are packed: one copy to the host for all of them.
        reply = pack_values(values, small=packed_on_host)
        for n, i in enumerate(reply.big):
            value = values[i]
            if keys[i] not in own_round or value.nbytes < _COPY_BELOW:
                value = host_copy(value)
            reply.bigs[n] = host_view(value)
        if self.group is not None:
            return self._reply(sender, encode(reply))
        return encode(reply)

    # -- events -----------------------------------------------------------------

    # -- updaters, optimizers, states -------------------------------------------

    # -- run control --------------------------------------------------------------
