"""What a push and a pull do in each kind of store: one object per server,
chosen when it starts (:class:`SyncMode`, :class:`AsyncMode`, :class:`SspMode`).

dist_sync rounds (:class:`SyncMode`): per key, the server collects one push per
rank; the W-th completes the round, the sum goes through ``Shard.apply`` once,
and the round counter advances. A rank's pull waits for the round its last
push joined; a sender that never pushed the key (the notebook watching) gets
the last completed value at once.

dist_async (:class:`AsyncMode`): each push is applied as it arrives (a sliced
key with a custom updater in server 0's order, see
:mod:`labkv.cluster._server.updates`); a pull waits for nothing more.

dist_ssp (:class:`SspMode`, :class:`~labkv.cluster._server.ssp_clocks.Clocks`):
pushes are applied as in dist_async and advance the pushing rank's clock of
their keys; a pull waits until every rank's clock is within the staleness
bound of the puller's.

Every push first goes through :meth:`Mode.intake`: its keys checked, its
values read with this server's piece shapes, a resend the log has applied
dropped, compressed codes decoded. Every pull's reply is :meth:`Mode.values`.

Inside ``kv.steps`` a push and a pull carry the rank's step: a push of a (key, rank, step)
already here is a replacement's replay, skipped (and audited), and a dist_sync pull reads the
key as of its step's start (see :mod:`labkv.cluster._server.replication.step_marks`).
"""

from __future__ import annotations

import time
from collections.abc import Set
from typing import TYPE_CHECKING, Any

from ..._types import Key
from ...compression import sum_from_wire
from ...shard import Shard
from .._device import host_copy, host_view, packed_on_host
from .._errors import Failure
from .._protocol.entries import Clock
from .._protocol.messages import Codes, Push, encode, pack_values, push_items
from .._protocol.packing import PACK_BELOW
from .._rows.server import read_rows, request_nbytes
from .key_table import KeyTable
from .replication.step_marks import StepMarks
from .reports import Reports
from .rounds import Staging, SyncRounds
from .sender_order import UpdateQueues
from .ssp_clocks import Clocks, ClocksSnapshot
from .updates import KeptVotes, Updates
from .waiting import Waiters

if TYPE_CHECKING:
    from .replication.null import NullLog
    from .replication.replica_log import ReplicaLog

_NONE: frozenset = frozenset()
# Values smaller than this are copied before they are returned by a pull: the
# reply is serialised after the method returns, and an unrelated push could
# change the stored array in between. Big values of a rank's own sync round are
# sent without a copy (no push can change them before that rank pushes again).
_COPY_BELOW = 1 << 20


class Mode:
    """What every mode shares; the hooks a mode may change (see module doc)."""

    #: Whether a round holds every rank's push of a key (dist_sync).
    sync = False

    def __init__(
        self,
        shard: Shard,
        table: KeyTable,
        rounds: SyncRounds,
        reports: Reports,
        waiting: Waiters,
        log: NullLog | ReplicaLog,
        updates: Updates,
        marks: StepMarks,
    ) -> None:
        self.shard, self.table, self.rounds, self.reports = shard, table, rounds, reports
        self.waiting, self.log, self.updates, self.marks = waiting, log, updates, marks

    def use(self, log: NullLog | ReplicaLog) -> None:
        """Issue to ``log`` from now on (the server joined a group of replicas)."""
        self.log = log

    def intake(self, push: Push) -> list[tuple[Key, Any]]:
        """``(key, value)`` of a push, to apply (see module doc)."""
        h = push.header
        values = self.shard.values
        for key in h.keys:
            if key not in values:
                raise KeyError(f"key {key!r} is not initialised on server {self.table.sid}")
        items = push_items(push, self._piece_spec)
        self.reports.bytes_in += sum(v.nbytes for _, v in items)  # as they travelled
        items = self.log.fresh(h.sender, h.seq, items, self)
        if h.codes is not None:
            items = self._decompressed(items, h.codes)
        return items

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
            value = sum_from_wire(kind, threshold, packed, stored.size)  # a new array
            result.append((key, value.reshape(stored.shape)))
        return result

    async def push(self, push: Push) -> None:
        raise NotImplementedError

    def values(
        self, keys: list[Key], own: Set[Key], before: dict | None = None, rows: dict | None = None
    ) -> tuple | bytes:
        """The encoded :class:`~labkv.cluster._protocol.messages.Values` a pull of
        ``keys`` returns (``own``: those read in the sender's own round;
        ``before``: keys read one round back, see :meth:`as_of`; ``rows``: the
        rows read alone, see :mod:`labkv.cluster._rows.server`)."""
        values = [self.shard.read(key) for key in keys]
        if before:
            values = [before.get(k, v) for k, v in zip(keys, values, strict=True)]
            own = own - before.keys()
        values = read_rows(values, keys, rows, {k: self.table.meta[k].shape for k in rows or ()})
        self.reports.bytes_in += request_nbytes(rows)
        self.reports.bytes_out += sum(v.nbytes for v in values)
        # Small values are packed: one copy to the host for all of them.
        reply = pack_values(values, small=packed_on_host)
        for n, i in enumerate(reply.big):
            value = values[i]
            if keys[i] not in own or value.nbytes < _COPY_BELOW:
                value = host_copy(value)
            reply.bigs[n] = host_view(value)
        return encode(reply)

    async def readable(
        self, sender: str, keys: list[Key], rank: int | None = None, step: int | None = None
    ) -> Set[Key]:
        """Wait until ``sender`` (rank ``rank`` in ``step``, inside a step loop)
        may read ``keys``; those it reads in its own round (their big values go
        without a copy)."""
        return _NONE

    def as_of(self, keys: list[Key], rank: int, step: int) -> dict[Key, Any]:
        """The keys ``rank``'s pull in ``step`` reads one round back (a replay)."""
        return {}

    def outside_open_rounds(self, sender: str, seq: int, items: list) -> list:
        """``items`` of ``sender``'s ``seq``-th push but those waiting in an open round."""
        return items

    def lowest_open(self, sender: str, low: int) -> int:
        """``low``, or the seq of a lower push of ``sender`` in an open round."""
        return low

    def entry_applied(
        self, updates: list[tuple[Key, Any]], pushes: list[tuple], failure: Failure | None
    ) -> None:
        """A backup applied a log entry (its updates failed as ``failure``)."""

    def promoted(self) -> None:
        """This replica just became its server's primary."""

    def configure(self, num_workers: int) -> None:
        """A new run of ``num_workers`` ranks on these servers."""

    def snapshot(self) -> ClocksSnapshot | None:
        return None

    def restore(self, snap: ClocksSnapshot | None) -> None:
        pass


class SyncMode(Mode):
    """dist_sync: rounds of W pushes (see module doc)."""

    sync = True

    def __init__(self, *parts: Any, staging: Staging) -> None:
        super().__init__(*parts)
        self.staging = staging

    async def push(self, push: Push) -> None:
        h = push.header
        sender, rank, seq = h.sender, h.rank, h.seq
        items = self.intake(push)
        borrowed = h.borrowed and bool(h.big)
        rounds, complete, step = self.rounds, [], h.step
        # while watched, the keys and values joined (two lists: no tuple per key)
        watched, keys, values = self.reports.active, [], []
        for key, value in items:
            if step is not None and self.marks.replayed(key, rank, step):
                self.marks.replayed_round(rounds, key, rank, step, sender, value)
                continue
            if rounds.ahead(key, rank):  # this rank is a round ahead: wait for the others
                if keys:  # the keys before it are in their rounds: seen while it waits
                    self.reports.receipts(keys, values, rank, in_rounds=True)
                    keys, values = [], []
                await self.waiting.until(
                    lambda k=key: not rounds.ahead(k, rank), lambda k=key: self.updates.missing(k)
                )
            # A borrowed value that completes its round is summed before this push
            # returns: only one that waits for other ranks needs a copy of its own.
            if borrowed and value.nbytes >= PACK_BELOW and not rounds.completes(key):
                value = self.staging.copy(key, rank, value)
            if step is not None:
                self.marks.mark(key, rank, step, rounds[key].done, value)
            completed = rounds.join(key, rank, sender, seq, value, time.monotonic())
            if watched:
                keys.append(key)
                values.append(value)
            if completed:
                complete.append(key)
        if watched:
            self.reports.receipts(keys, values, rank, in_rounds=True)
        if complete:
            self.updates.complete(complete, sender)

    async def readable(
        self, sender: str, keys: list[Key], rank: int | None = None, step: int | None = None
    ) -> Set[Key]:
        """The round of ``sender``'s last push of each key has completed; inside
        a step loop, the round of rank ``rank``'s last push before ``step``."""
        rounds, own, marks = self.rounds, set(), self.marks
        for key in keys:
            number = None if step is None else marks.joined(key, rank)
            if number is not None:
                if not marks.replayed(key, rank, step) and rounds[key].done <= number:
                    await self.waiting.until(
                        lambda k=key, n=number: rounds[k].done > n,
                        lambda k=key: self.updates.missing(k),
                    )
                own.add(key)
                continue
            if not rounds.pushed(sender, key):
                continue
            if not rounds.pull_ready(sender, key):
                await self.waiting.until(
                    lambda k=key: rounds.pull_ready(sender, k),
                    lambda k=key: self.updates.missing(k),
                )
            own.add(key)
        return own

    def as_of(self, keys: list[Key], rank: int, step: int) -> dict[Key, Any]:
        return self.marks.before_step(self.rounds, keys, rank, step)

    def outside_open_rounds(self, sender: str, seq: int, items: list) -> list:
        rounds = self.rounds
        return [(k, v) for k, v in items if rounds[k].senders.get(sender) != seq]

    def lowest_open(self, sender: str, low: int) -> int:
        return self.rounds.lowest_open(sender, low)

    def entry_applied(
        self, updates: list[tuple[Key, Any]], pushes: list[tuple], failure: Failure | None
    ) -> None:
        """Each updated key's round closes; a failed one is owed as ``failure``."""
        for key, value in updates:
            self.rounds[key].finish(failure if value is None else None)


class AsyncMode(Mode):
    """dist_async: pushes applied as they arrive (see module doc)."""

    def __init__(self, *parts: Any, queues: UpdateQueues, kept: KeptVotes) -> None:
        super().__init__(*parts)
        self.queues, self.kept = queues, kept

    async def push(self, push: Push) -> None:
        await self._push(push, None)

    async def _push(self, push: Push, note: Clock | None, fresh: list | None = None) -> None:
        """Apply a push (``note``: what its log entry says of it); ``fresh``
        gets the keys it pushes that are not replays."""
        h = push.header
        sender, rank, seq = h.sender, h.rank, h.seq
        items = self.intake(push)
        if h.step is not None:
            items = self.marks.fresh(items, rank, h.step)
        if fresh is not None:
            fresh.extend(k for k, _ in items)
        if self.reports.active:
            self.reports.receipts([k for k, _ in items], [v for _, v in items], rank, False)
        queued = []
        if self.shard.updater is not None:  # sliced keys: see Updates.queue
            queued = [(k, v) for k, v in items if k in self.table.sliced]
            items = [(k, v) for k, v in items if k not in self.table.sliced]
            for key, value in queued:
                self.updates.queue(sender, seq, key, value)
        try:
            self.log.issue_push(sender, seq, items, note, self._marks_of(h, items))
        except Exception as exc:
            keys = [k for k, _ in items]
            failure = self.updates.failure(exc, keys, {sender: dict.fromkeys(keys, seq)})
            raise failure.report_to(sender) from None
        finally:
            await self.updates.decided(sender, [k for k, _ in queued])

    def _marks_of(self, h: Any, items: list[tuple[Key, Any]]) -> list[tuple] | None:
        if h.step is None:
            return None
        digests = self.marks.digests
        return [(k, h.rank, h.step, -1, digests.get((k, h.rank), b"")) for k, _ in items]

    def entry_applied(
        self, updates: list[tuple[Key, Any]], pushes: list[tuple], failure: Failure | None
    ) -> None:
        """A sliced key's update (custom updater) is one more decided in server
        0's order, and numbers its sender's push (as its primary's queue did),
        so a new primary goes on from there."""
        if self.shard.updater is None:
            return
        sliced = self.table.sliced
        ordered = [(k, v) for k, v in updates if k in sliced]
        if not ordered:
            return
        for key, value in ordered:
            self.rounds[key].finish(failure if value is None else None)
        for sender, key, _ in pushes:
            if key in sliced:
                self.queues.of(key).applied(sender)

    def promoted(self) -> None:
        """Server 0's new primary places its old primary's pushes where that
        one told the other servers."""
        if self.table.sid != 0:
            return
        for key in self.table.sliced:
            self.queues.of(key).resume(self.rounds[key].done, self.kept.placed(key))


class SspMode(AsyncMode):
    """dist_ssp: as dist_async, and a pull within the staleness bound (see module doc).

    A push's clocks tick once it is applied or failed: with replicas as part of
    its log entry (so every replica ticks in the log's order), without when the
    push is over (after its sliced keys' updates are decided)."""

    def __init__(self, *parts: Any, queues: UpdateQueues, kept: KeptVotes, clocks: Clocks):
        super().__init__(*parts, queues=queues, kept=kept)
        self.clocks = clocks

    async def push(self, push: Push) -> None:
        h = push.header
        note = Clock(h.rank)
        fresh: list[Key] = []  # a replay's keys tick no clock
        try:
            await self._push(push, note, fresh)
        finally:
            self.log.after_push(note, h.sender, h.seq, fresh if h.step is not None else h.keys)

    async def readable(
        self, sender: str, keys: list[Key], rank: int | None = None, step: int | None = None
    ) -> Set[Key]:
        """Every rank is within the staleness bound of ``sender``'s clock of
        each key (a sender that never pushed here does not wait; a rank's
        replacement waits as the rank); with events on, each key's clocks and
        how long the pull waited are reported."""
        clocks = self.clocks
        rank = clocks.ranks.get(sender) if rank is None else rank
        if rank is None:
            return _NONE
        watched = self.reports.active
        for key in keys:
            start = time.monotonic() if watched else 0.0
            if not clocks.ready(key, rank):
                await self.waiting.until(
                    lambda k=key: clocks.ready(k, rank), lambda k=key: clocks.behind(k, rank)
                )
            if watched and self.table.first_piece.get(key, True):
                self.reports.clocks(clocks, key, rank, time.monotonic() - start)
        return _NONE

    def configure(self, num_workers: int) -> None:
        self.clocks.reset(num_workers)

    def snapshot(self) -> ClocksSnapshot:
        return self.clocks.snapshot()

    def restore(self, snap: ClocksSnapshot | None) -> None:
        self.clocks.restore(snap)


def new_mode(
    parts: tuple,
    sync: bool,
    staging: Staging,
    queues: UpdateQueues,
    kept: KeptVotes,
    clocks: Clocks | None,
) -> Mode:
    """A server's mode: dist_sync, dist_async, or dist_ssp (with ``clocks``)."""
    if sync:
        return SyncMode(*parts, staging=staging)
    if clocks is None:
        return AsyncMode(*parts, queues=queues, kept=kept)
    return SspMode(*parts, queues=queues, kept=kept, clocks=clocks)
