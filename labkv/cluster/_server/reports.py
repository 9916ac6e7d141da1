"""A server's events: push receipts, round and clock reports, its load.

A mixin of :class:`~labkv.cluster._server.actor.Server`; the bodies stay as the event code
wants them (see :mod:`labkv.cluster._events` for how they travel).
"""

from __future__ import annotations

import time
from typing import Any

from .._errors import answered
from .rounds import Round

Key = int | str


class ServerEvents:
    """What a server reports to the notebook (see module doc)."""

    def _emit_receipt(self, key: Key, value: Any, rank: int) -> None:
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
                first_piece=self.first_piece[key],
            )

    def _annotate(self, event: dict[str, Any]) -> None:
        """Counted pushes (``bus.flush()``) say whether they are slice 0's too, so
        that views count each push of a sliced key once."""
        if event["op"] == "push" and event["tally"]:
            event["first_piece"] = self.first_piece.get(event["key"], True)

    def _emit_round(self, key: Key, r: Round, completed: int | None = None) -> None:
        pushed = sorted(r.pending)
        waited = 0.0 if r.first_push is None else time.monotonic() - r.first_push
        self.bus.emit(
            "round",
            key,
            server=self.sid,
            extra={
                "round": r.done if completed is None else completed,
                "pushed": pushed,
                "missing": sorted(set(range(self.num_workers)) - set(pushed)),
                "num_workers": self.num_workers,
                "waited_s": waited,
                "complete": completed is not None,
            },
        )

    def _emit_clocks(self, key: Key, rank: int, waited: float) -> None:
        clocks = self.clocks.of(key)
        slowest, low = self.clocks.slowest(key)
        self.bus.emit(
            "clock",
            key,
            rank=rank,
            server=self.sid,
            extra={
                "clocks": [clocks[r] for r in sorted(clocks)],  # by rank (msgpack: no int keys)
                "clock": clocks.get(rank, 0),
                "staleness": self.clocks.staleness,
                "slowest": slowest,
                "slowest_clock": low,
                "waited_s": waited,
            },
        )

    def _load(self) -> dict[str, Any]:
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

    @answered
    async def streaming(
        self, on: bool, detail_interval: float = 0.0, detail_burst: int = 1
    ) -> None:
        """Send batched events to the store's topic (on) or stop (off); the
        detail settings are those of the notebook's subscribers."""
        if on:
            self.stream.start(detail_interval, detail_burst)
        else:
            self.stream.stop()

    @answered
    async def load(self) -> dict[str, Any]:
        """Bytes in/out so far, keys held and bytes held."""
        return self._load()
