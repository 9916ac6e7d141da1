"""What the monitor's model keeps per key, per key's round and clocks, and per server.

>>> from labkv.events import Event
>>> fan = FanIn("w")
>>> fan.per_server[0] = (1.0, {"round": 2, "num_workers": 2, "pushed": [0], "missing": [1]})
>>> sorted(fan.current()["missing"])
[1]
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .._types import Key
from ..events import Event

__all__ = ["CHANGING_OPS", "UPDATER_OPS", "FanIn", "KeyClocks", "KeyStats", "ServerLoad"]

Summary = dict[str, float]

#: ops after which the stored value of a key may differ
CHANGING_OPS = frozenset({"init", "push", "update", "optimizer"})
#: ops that are an updater call (custom updater or optimizer step)
UPDATER_OPS = frozenset({"update", "optimizer"})


@dataclass
class KeyStats:
    """Per-key counters and the last known value summary."""

    key: Key
    pushes: int = 0
    pulls: int = 0
    updates: int = 0
    inits: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    shape: tuple[int, ...] = ()
    dtype: str = ""
    value: Summary | None = None
    last_op: str = ""
    last_change: float = 0.0
    has_updater: bool = False
    #: held by servers: events carry what was pushed, not what is stored, so the
    #: value summary is read from the servers after they change it
    on_servers: bool = False


@dataclass
class FanIn:
    """One key's latest ``dist_sync`` round, combined over the servers holding it."""

    key: Key
    per_server: dict[Any, tuple[float, dict[str, Any]]] = field(default_factory=dict)

    def current(self) -> dict[str, Any]:
        """``round``, ``num_workers``, ``pushed``/``missing`` rank sets, ``waited_s``,
        ``complete`` and ``time`` of the newest round any server reported."""
        latest = max(int(extra.get("round", 0)) for _, extra in self.per_server.values())
        now = [(t, e) for t, e in self.per_server.values() if int(e.get("round", 0)) == latest]
        workers = max(int(e.get("num_workers", 0)) for _, e in now)
        # A rank has pushed a sliced key only when every server of this round has its slice.
        pushed = set.intersection(*(set(e.get("pushed", ())) for _, e in now))
        complete = all(bool(e.get("complete")) for _, e in now)
        missing: set[int] = set()
        if not complete:
            missing = set().union(*(set(e.get("missing", ())) for _, e in now))
            missing |= set(range(workers)) - pushed
        return {
            "round": latest,
            "num_workers": workers,
            "pushed": pushed,
            "missing": missing,
            "waited_s": max(float(e.get("waited_s", 0.0)) for _, e in now),
            "complete": complete,
            "time": max(t for t, _ in now),
        }


@dataclass
class KeyClocks:
    """One key's dist_ssp clocks, from the ``clock`` events of its pulls: every
    rank's clock (its pushes of the key), and per rank how long its pulls
    waited for the slowest (``waited``: in total; ``last_wait``: the last pull).

    >>> c = KeyClocks("w")
    >>> c.fold(Event(0, 1.0, "s", "clock", "w", rank=0, extra={"clocks": [4, 1],
    ...     "staleness": 2, "waited_s": 0.25}))
    >>> c.clocks, c.slowest(), c.waited
    ([4, 1], [1], {0: 0.25})
    """

    key: Key
    clocks: list[int] = field(default_factory=list)
    staleness: int = 0
    waited: dict[int, float] = field(default_factory=dict)
    last_wait: dict[int, float] = field(default_factory=dict)
    pulls: dict[int, int] = field(default_factory=dict)
    time: float = 0.0

    def fold(self, e: Event) -> None:
        x = e.extra
        # One server reports a key's clocks (slice 0's), in order: the newest holds.
        # (A new run on the same store starts them from 0 again.)
        self.clocks = list(x.get("clocks", ()))
        self.staleness = int(x.get("staleness", self.staleness))
        self.time = max(self.time, e.time)
        # a server's record of many pulls: per rank [waited in all, last wait, pulls]
        waits = x.get("waits") or [[e.rank, float(x.get("waited_s", 0.0)), None, e.count]]
        for rank, total, last, pulls in waits:
            self.waited[rank] = self.waited.get(rank, 0.0) + float(total)
            self.last_wait[rank] = float(total if last is None else last)
            self.pulls[rank] = self.pulls.get(rank, 0) + pulls

    def slowest(self) -> list[int]:
        """The ranks with the lowest clock."""
        if not self.clocks:
            return []
        low = min(self.clocks)
        return [r for r, c in enumerate(self.clocks) if c == low]


@dataclass
class ServerLoad:
    """Bytes in/out of one server: from its ``load`` events, else summed from
    the push/pull events that name it; ``history`` is a ring of ``(time, in, out)``."""

    server: Any
    bytes_in: int = 0
    bytes_out: int = 0
    keys: int | None = None
    bytes_held: int | None = None
    device: str = ""
    reported: bool = False
    #: a replicated server's workers, primary first (empty: not replicated)
    replicas: tuple[str, ...] = ()
    history: deque[tuple[float, int, int]] = field(default_factory=lambda: deque(maxlen=300))
