"""What a server reports to the notebook: push receipts, round and clock
events, its load (bytes in and out, keys and bytes held, messages), and the
loss of a backup (see :mod:`labkv.cluster._event_relay` for how events travel).
"""

from __future__ import annotations

import time
from typing import Any

from ..._types import Key
from ...events import COMPACT_AT, EventBus, round_extra
from ...events._round_records import RoundColumns, ranks_mask
from ...shard import Shard
from .key_table import KeyTable
from .rounds import Round, SyncRounds
from .ssp_clocks import Clocks


class Reports:
    """The events and counters of server ``sid``, sent on ``bus`` (see module doc)."""

    def __init__(
        self,
        sid: int,
        device_name: str,
        bus: EventBus,
        shard: Shard,
        table: KeyTable,
        rounds: SyncRounds,
    ) -> None:
        self.sid, self.device_name, self.bus = sid, device_name, bus
        self.shard, self.table, self.rounds = shard, table, rounds
        self.bytes_in = self.bytes_out = 0
        self.messages = {"push": 0, "pull": 0}
        #: the keys whose rounds changed since the bus's last flush (an ordered set),
        #: and the rounds completed (their number, wait, ranks and the run's number of
        #: ranks): sent as records at its next flush (see round)
        self._changed: dict[Key, None] = {}
        self._ended: dict[Key, tuple[int, float, list[int], int]] = {}
        #: dist_ssp waits kept per key and rank ``[in all, last, pulls]`` (see clocks)
        self._waits: dict[Key, dict[int, list[Any]]] = {}
        self._clocks: dict[Key, tuple[list[int] | None, int, Clocks]] = {}
        #: pushes only noted (their keys, bytes per key), counted at the next flush
        #: (see receipts)
        self._received: list[tuple[list[Key], list[int]]] = []
        bus.on_flush.append(self._send_rounds)

    @property
    def active(self) -> bool:
        """Whether anyone watches (else events are not even made)."""
        return self.bus.active

    def receipts(self, keys: list[Key], values: list[Any], rank: int, in_rounds: bool) -> None:
        """Rank ``rank``'s push of ``values`` to ``keys`` arrived (and joined their
        keys' open rounds: ``in_rounds``). While the bus has detail left for pushes,
        a key gets a detailed event; once it has none, the rest of the push is kept
        whole and counted at the next flush (:meth:`EventBus.counted`): at 64 ranks
        and 500 keys a server receives 32,000 pushes of keys a round, and a push of
        the same keys from every rank reaches the flush as columns, not key by key."""
        if not keys:
            return
        if in_rounds:
            self._changed.update(dict.fromkeys(keys))
        bus, i = self.bus, 0
        while i < len(keys) and not bus.used_up("push"):
            key, value = keys[i], values[i]
            i += 1
            admitted = bus.admit("push", key, int(value.nbytes), rank, self.sid)
            if admitted:  # else only counted: bus.flush() reports it at the next tick
                bus.emit(
                    "push",
                    key,
                    value,
                    rank=rank,
                    server=self.sid,
                    count=admitted[0],
                    nbytes=admitted[1],
                    first_piece=self.table.first_piece[key],
                )
        if i < len(keys):
            self._received.append((keys[i:], [v.nbytes for v in values[i:]]))

    def annotate(self, event: dict[str, Any]) -> None:
        """Counted pushes (``bus.flush()``) say whether they are slice 0's too, so
        that views count each push of a sliced key once (a record of many keys:
        per key, in ``extra["first"]``)."""
        if event["op"] == "push" and event["tally"]:
            first = self.table.first_piece
            keys = event["extra"].get("keys") if event["key"] is None else None
            if keys is not None:
                event["extra"]["first"] = [first.get(k, True) for k in keys]
            else:
                event["first_piece"] = first.get(event["key"], True)

    def round(self, key: Key, r: Round, completed: int | None = None) -> None:
        """``key``'s round changed (a push joined it, or it ``completed``): its
        state goes out at the bus's next flush, as one record per key (and one
        more for a round completed since), not one event per push. Each record
        lists W ranks: one per push made the server's work O(W^2) per key-round."""
        if completed is not None:  # what it was as it completed (the run may end next)
            waited = 0.0 if r.first_push is None else time.monotonic() - r.first_push
            self._ended[key] = (completed, waited, list(r.pending), self.rounds.num_workers)
        self._changed[key] = None

    def _send_rounds(self) -> None:
        """The bus flushes: the dist_ssp waits kept go out (one record per key),
        the receipts only noted go to its counts, and the
        rounds changed since its last flush go out as one event
        per key, or as one record of them all for more than ``COMPACT_AT`` keys
        (:func:`labkv.events.round_rows` reads either)."""
        if self._waits:
            self._send_clocks()
        received, self._received = self._received, []
        for keys, nbytes in received:
            self.bus.counted("push", keys, nbytes, self.sid)
        changed, self._changed = self._changed, {}
        ended, self._ended = self._ended, {}
        if not changed:
            return
        # the ranks of the run the rounds were made in: a run that ended before this
        # flush has set the store back to its 1 rank (SyncRounds.resize)
        workers = max([self.rounds.num_workers, *(done[3] for done in ended.values())])
        everyone = (1 << self.rounds.num_workers) - 1  # a bit per rank
        record = RoundColumns()
        now = time.monotonic()
        rounds = self.rounds.rounds
        for key in changed:
            r = rounds.get(key)
            if r is None:
                continue
            done = ended.get(key)
            if done is not None:
                record.add(key, done[0], done[2], (), done[1], True)
            if r.pending:
                pushed = ranks_mask(r.pending)
                waited = 0.0 if r.first_push is None else now - r.first_push
                record.add_masks(key, r.done, pushed, everyone & ~pushed, waited, False)
        if len(record) > COMPACT_AT:
            extra = {"num_workers": workers, "round_columns": record.columns()}
            self.bus.emit("round", None, server=self.sid, extra=extra)
            return
        for row in record.rows():
            self.bus.emit("round", row[0], server=self.sid, extra=round_extra(row, workers))

    def round_ended(self, key: Key, r: Round) -> None:
        """A dist_sync round of ``key`` finishes (watched or not)."""
        if self.bus.active:
            self.round(key, r, completed=r.done)

    def clocks(self, clocks: Clocks, key: Key, rank: int, waited: float) -> None:
        """A dist_ssp pull of ``key`` by ``rank`` waited ``waited`` s for the
        slowest rank: a detailed ``clock`` event while the op's budget lasts, else
        kept here and sent at the next flush as one record of the key (its clocks
        then, and per rank the waits and pulls since: ``extra["waits"]``)."""
        if self.bus.take_detail("clock"):
            self._emit_clock(_clock_view(clocks, key), key, rank, waited, 1)
            return
        # What the clocks are now, kept by reference (O(1)): by the flush the run may
        # have ended and the store gone back to 1 rank (Clocks.reset drops the rows).
        self._clocks[key] = (clocks.clocks.get(key), clocks.num_workers, clocks)
        waits = self._waits.setdefault(key, {})
        kept = waits.get(rank)
        if kept is None:
            waits[rank] = [waited, waited, 1]
        else:
            kept[0] += waited
            kept[1] = waited
            kept[2] += 1

    def _emit_clock(
        self,
        view: tuple[list[int], Clocks],
        key: Key,
        rank: int,
        waited: float,
        count: int,
        waits: list[list[Any]] | None = None,
    ) -> None:
        by_rank, clocks = view
        live = {r: c for r, c in enumerate(by_rank) if r not in clocks.gone}
        low = min(live.values(), default=0)
        extra = {
            "clocks": by_rank,  # by rank (msgpack: no int keys)
            "clock": by_rank[rank] if rank < len(by_rank) else 0,
            "staleness": clocks.staleness,
            "slowest": [r for r, c in live.items() if c == low],
            "slowest_clock": low,
            "waited_s": waited,
        }
        if waits is not None:
            extra["waits"] = waits  # [rank, waited in all, the last wait, pulls]
        self.bus.emit("clock", key, rank=rank, server=self.sid, count=count, extra=extra)

    def _send_clocks(self) -> None:
        """The dist_ssp waits kept since the last flush, one record per key: the
        rank that waited longest names it (its last wait is the record's)."""
        kept, self._waits = self._waits, {}
        for key, waits in kept.items():
            rows = [[rank, total, last, n] for rank, (total, last, n) in sorted(waits.items())]
            rank, _, last, _ = max(rows, key=lambda row: row[1])
            pulls = sum(row[3] for row in rows)
            row, workers, clocks = self._clocks.pop(key)
            by_rank = [row[r] if row is not None and r < len(row) else 0 for r in range(workers)]
            self._emit_clock((by_rank, clocks), key, rank, last, pulls, rows)

    def backup_lost(self, lost: list[Any], members: list[Any]) -> None:
        """A backup was lost (the primary stays): ``members`` are the replicas left."""
        if self.bus.active:
            extra = {
                "replicas": [m.address for m in members],
                "primary": members[0].address,
                "lost": [m.address for m in lost],
                "promoted": False,
            }
            self.bus.emit("failover", None, server=self.sid, extra=extra)

    def load(self) -> dict[str, Any]:
        held = sum(int(v.nbytes) for v in self.shard.values.values())
        held += sum(int(a.nbytes) for s in self.shard.states.values() for a in s)
        return {
            "server": self.sid,
            "device": self.device_name,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "keys": len(self.shard.values),
            "bytes_held": held,
            "messages": dict(self.messages),
        }


def _clock_view(clocks: Clocks, key: Key) -> tuple[list[int], Clocks]:
    """``key``'s clock of every rank now (0 for a rank that has not pushed it)."""
    of = clocks.of(key)
    return [of[r] for r in sorted(of)], clocks
