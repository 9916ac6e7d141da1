"""What the monitor's model keeps per key, per key's round and clocks, and per server.

>>> from labkv.events import Event
>>> fan = FanIn("w")
>>> fan.report(0, 1.0, {"round": 2, "num_workers": 2, "pushed": [0], "missing": [1]})
>>> sorted(fan.current()["missing"])
[1]
"""

from __future__ import annotations

import functools
import operator
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..._types import Key
from ...events import Event
from ...events._round_records import mask_ranks, ranks_mask

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
    #: a row-sparse key (its init said so)
    sparse: bool = False
    #: rows of row-sparse values pushed and pulled (``extra["rows"]`` of the events,
    #: counted calls included; on a cluster, from the ranks' events)
    rows_in: int = 0
    rows_out: int = 0


@dataclass
class FanIn:
    """One key's latest ``dist_sync`` round, combined over the servers holding it:
    per server ``(time, round, num_workers, pushed, missing, waited_s, complete)``,
    the ranks as bit masks (:func:`labkv.events._round_records.ranks_mask`; a tuple of
    numbers is one object the collector soon stops tracking, a dict of lists three)."""

    key: Key
    per_server: dict[Any, tuple[float, int, int, int, int, float, bool]] = field(
        default_factory=dict
    )
    #: what current() made since the last report (a refresh reads it 4 times, and at
    #: 64 ranks x 500 keys making it was most of the fan-in tab's refresh)
    _current: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def report(self, server: Any, time: float, extra: dict[str, Any]) -> None:
        """A server's report of the key's round (``extra`` as :func:`~labkv.events.round_rows`)."""
        self.report_masks(
            server,
            time,
            int(extra.get("round", 0)),
            int(extra.get("num_workers", 0)),
            ranks_mask(extra.get("pushed", ())),
            ranks_mask(extra.get("missing", ())),
            float(extra.get("waited_s", 0.0)),
            bool(extra.get("complete")),
        )

    def report_masks(
        self,
        server: Any,
        time: float,
        number: int,
        workers: int,
        pushed: int,
        missing: int,
        waited: float,
        complete: bool,
    ) -> None:
        """:meth:`report`, the ranks as bit masks (a server's record of many keys)."""
        self.per_server[server] = (time, number, workers, pushed, missing, waited, complete)
        self._current = None

    def current(self) -> dict[str, Any]:
        """``round``, ``num_workers``, ``pushed``/``missing`` rank sets (frozen), ``waited_s``,
        ``complete`` and ``time`` of the newest round any server reported (not to
        be changed: the same dict until the next :meth:`report`)."""
        if self._current is None:
            self._current = self._combine()
        return self._current

    def _combine(self) -> dict[str, Any]:
        reports = list(self.per_server.values())
        if len(reports) == 1:  # a key held whole by one server
            when, latest, workers, pushed, missing, waited, complete = reports[0]
        else:
            latest = max(r[1] for r in reports)
            now = [r for r in reports if r[1] == latest]
            workers = max(r[2] for r in now)
            # A rank has pushed a sliced key only when every server of this round has its slice.
            pushed = functools.reduce(operator.and_, (r[3] for r in now))
            missing = functools.reduce(operator.or_, (r[4] for r in now))
            complete = all(r[6] for r in now)
            waited, when = max(r[5] for r in now), max(r[0] for r in now)
        missing = 0 if complete else missing | (((1 << workers) - 1) & ~pushed)
        return {
            "round": latest,
            "num_workers": workers,
            "pushed": _ranks_of(pushed),
            "missing": _ranks_of(missing),
            "waited_s": waited,
            "complete": complete,
            "time": when,
        }


#: rank sets by their mask: the keys of a run share a few (every rank; every rank
#: but the one late), and a refresh reads every key's round
_RANK_SETS: dict[int, frozenset[int]] = {}


def _ranks_of(mask: int) -> frozenset[int]:
    ranks = _RANK_SETS.get(mask)
    if ranks is None:
        if len(_RANK_SETS) >= 4096:
            _RANK_SETS.clear()
        ranks = _RANK_SETS[mask] = frozenset(mask_ranks(mask))
    return ranks


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
    #: the primary's own counters (bytes in, out), and each backup's (by its worker):
    #: those of the pulls it answered for the ranks on its worker (near reads)
    own: tuple[int, int] = (0, 0)
    reads: dict[str, tuple[int, int]] = field(default_factory=dict)

    def fold_report(self, e: Event) -> None:
        """A ``load`` event: a replica's own cumulative counters. The server's
        bytes are its primary's plus what its backups served (a backup's event
        says ``primary`` False; the rest of the row is the primary's to tell).

        >>> load = ServerLoad(0)
        >>> for primary, sent in ((True, 100), (False, 40), (True, 150)):
        ...     extra = {"bytes_out": sent, "primary": primary, "address": f"w{int(primary)}"}
        ...     load.fold_report(Event(0, 0.0, "dist_sync", "load", None, server=0, extra=extra))
        >>> load.bytes_out
        190
        """
        x = e.extra
        self.reported = True
        address = x.get("address")
        if x.get("primary") is False:
            self.reads[address] = (int(x.get("bytes_in", 0)), int(x.get("bytes_out", 0)))
        else:
            self.reads.pop(address, None)  # promoted: its own counters hold its reads now
            self.own = (int(x.get("bytes_in", self.own[0])), int(x.get("bytes_out", self.own[1])))
            self.keys = x.get("keys", self.keys)
            self.bytes_held = x.get("bytes_held", self.bytes_held)
            self.device = str(x.get("device", self.device))
            self.replicas = tuple(x.get("replicas", self.replicas))
        self.bytes_in = self.own[0] + sum(r[0] for r in self.reads.values())
        self.bytes_out = self.own[1] + sum(r[1] for r in self.reads.values())
        self.history.append((e.time, self.bytes_in, self.bytes_out))

    def fold_traffic(self, e: Event) -> None:
        """A push or pull the server received, summed while it reports no counters."""
        if self.reported:  # the server's own cumulative counters win
            return
        if e.op == "push":
            self.bytes_in += e.nbytes
        else:
            self.bytes_out += e.nbytes
        history = self.history
        if history and e.time - history[-1][0] < 0.1:  # one point per 100 ms is plenty
            history[-1] = (history[-1][0], self.bytes_in, self.bytes_out)
        else:
            history.append((e.time, self.bytes_in, self.bytes_out))
