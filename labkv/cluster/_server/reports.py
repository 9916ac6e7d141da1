"""What a server reports to the notebook: push receipts, round and clock
events, its load (bytes in and out, keys and bytes held, messages), and the
loss of a backup (see :mod:`labkv.cluster._events` for how events travel).
"""

from __future__ import annotations

import time
from typing import Any

from ..._types import Key
from ...events import EventBus
from ...shard import Shard
from .clocks import Clocks
from .keys import KeyTable
from .rounds import Round, SyncRounds


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

    @property
    def active(self) -> bool:
        """Whether anyone watches (else events are not even made)."""
        return self.bus.active

    def receipt(self, key: Key, value: Any, rank: int) -> None:
        admitted = self.bus.admit("push", key, int(value.nbytes), rank, self.sid)
        if admitted:  # else only counted: bus.flush() reports it at the next tick
            self.bus.emit(
                "push",
                key,
                value,
                rank=rank,
                server=self.sid,
                count=admitted[0],
                nbytes=admitted[1],
                first_piece=self.table.first_piece[key],
            )

    def annotate(self, event: dict[str, Any]) -> None:
        """Counted pushes (``bus.flush()``) say whether they are slice 0's too, so
        that views count each push of a sliced key once."""
        if event["op"] == "push" and event["tally"]:
            event["first_piece"] = self.table.first_piece.get(event["key"], True)

    def round(self, key: Key, r: Round, completed: int | None = None) -> None:
        num_workers = self.rounds.num_workers
        pushed = sorted(r.pending)
        waited = 0.0 if r.first_push is None else time.monotonic() - r.first_push
        self.bus.emit(
            "round",
            key,
            server=self.sid,
            extra={
                "round": r.done if completed is None else completed,
                "pushed": pushed,
                "missing": sorted(set(range(num_workers)) - set(pushed)),
                "num_workers": num_workers,
                "waited_s": waited,
                "complete": completed is not None,
            },
        )

    def round_ended(self, key: Key, r: Round) -> None:
        """A dist_sync round of ``key`` finishes (watched or not)."""
        if self.bus.active:
            self.round(key, r, completed=r.done)

    def clocks(self, clocks: Clocks, key: Key, rank: int, waited: float) -> None:
        of = clocks.of(key)
        slowest, low = clocks.slowest(key)
        self.bus.emit(
            "clock",
            key,
            rank=rank,
            server=self.sid,
            extra={
                "clocks": [of[r] for r in sorted(of)],  # by rank (msgpack: no int keys)
                "clock": of.get(rank, 0),
                "staleness": clocks.staleness,
                "slowest": slowest,
                "slowest_clock": low,
                "waited_s": waited,
            },
        )

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
