"""The monitor's model: what the views show, folded from a store's events.

Pure Python (no ipywidgets, no bokeh), so it works in scripts and tests. The
subscriber callback :meth:`MonitorModel.on_event` only appends to a deque;
:meth:`MonitorModel.flush` folds the pending events into counters, rings and
tables, on the view's throttled refresh (or inline when too many pile up, so
memory stays bounded with no front end).

>>> import labkv, numpy as np
>>> kv = labkv.create("local")
>>> model = MonitorModel()
>>> sub = kv.events.subscribe(model.on_event)
>>> kv.init("w", np.zeros(3))
>>> kv.push("w", np.ones(3))
>>> model.flush()
2
>>> stats = model.keys["w"]
>>> stats.pushes, stats.bytes_in, stats.value["mean"]
(1, 24, 1.0)
>>> sub.unsubscribe()
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections import Counter, deque
from collections.abc import Iterator
from itertools import compress
from typing import Any

from ..._types import Key
from ...events import Event, compact_rows, round_rows
from .folds import fold_failover, fold_rows
from .records import CHANGING_OPS, UPDATER_OPS, FanIn, KeyClocks, KeyStats, ServerLoad, Summary

__all__ = ["FanIn", "KeyClocks", "KeyStats", "MonitorModel", "ServerLoad"]


class MonitorModel:
    """Counters, rings and tables over a stream of :class:`~labkv.events.Event`.

    Everything is bounded: the event log and the updater trace are rings, the
    timeline (what :meth:`Monitor.export_trace` writes) holds the last
    ``timeline_s`` seconds of events (by their time), at most ``timeline_size``,
    the per-server history is a ring, at most ``max_keys`` keys are tracked
    (``dropped_keys`` counts the rest), and at most ``max_pending`` events
    wait for a flush before the callback folds them itself.
    """

    def __init__(
        self,
        log_size: int = 500,
        trace_size: int = 100,
        history: int = 300,
        max_keys: int = 10_000,
        max_pending: int = 10_000,
        timeline_size: int = 20_000,
        timeline_s: float = 10.0,
    ):
        self.lock = threading.RLock()
        self._pending: deque[Event] = deque()
        self._quiet = threading.local()
        self.max_pending = max_pending
        self.max_keys = max_keys
        self._history = history
        self.log: deque[Event] = deque(maxlen=log_size)
        self.trace: deque[Event] = deque(maxlen=trace_size)
        #: every event folded but server load reports, of the last ``timeline_s``
        #: seconds (``timeline_size`` at most, a bound on memory): what a trace export holds
        self.timeline: deque[Event] = deque(maxlen=timeline_size)
        self.timeline_s = float(timeline_s)
        self.reset()

    def reset(self) -> None:
        """Forget everything seen (e.g. when the monitor moves to another store)."""
        with self.lock:
            self._pending.clear()
            self.log.clear()
            self.trace.clear()
            self.timeline.clear()
            self.counts: Counter[str] = Counter()
            self.keys: dict[Key, KeyStats] = {}
            self.fanin: dict[Key, FanIn] = {}
            self.clocks: dict[Key, KeyClocks] = {}
            self.servers: dict[Any, ServerLoad] = {}
            self.changed: set[Key] = set()
            self.server_changed: set[Key] = set()
            #: detailed updater calls folded (the rest of ``updates`` were only counted)
            self.updates_detailed = 0
            #: per server, the primaries a failover lost with their last reports:
            #: that server's push and updater counts are at least what they show
            self.lost_reports: dict[Any, list[str]] = {}
            self.dropped_keys = 0
            self.events_seen = 0
            self.last_time = 0.0
            #: bumped by every flush that folded something; views skip work when unchanged
            self.version = 0

    # -- intake (any thread) ------------------------------------------------------
    def on_event(self, event: Event) -> None:
        """The bus subscriber: O(1) append; folds inline only past ``max_pending``."""
        if getattr(self._quiet, "on", False):
            return
        self._pending.append(event)
        if len(self._pending) >= self.max_pending:
            self.flush()

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """Ignore events made on this thread inside the block (the monitor's own reads).

        >>> model = MonitorModel()
        >>> with model.quiet():
        ...     model.on_event(Event(0, 0.0, "s", "pull", 1))
        >>> model.flush()
        0
        """
        self._quiet.on = True
        try:
            yield
        finally:
            self._quiet.on = False

    @property
    def pending(self) -> int:
        """Events received but not folded yet."""
        return len(self._pending)

    def flush(self) -> int:
        """Fold every pending event; returns how many were folded."""
        with self.lock:
            n = 0
            pending = self._pending
            while pending:
                try:
                    event = pending.popleft()
                except IndexError:  # another thread drained it first
                    break
                self._fold(event)
                n += 1
            if n:
                self.version += 1
            return n

    # -- folding (under the lock) -----------------------------------------------
    def _fold(self, e: Event) -> None:
        op = e.op
        count = e.count
        self.counts[op] += count
        self.events_seen += count
        if e.time > self.last_time:
            self.last_time = e.time
        if op == "load":
            self._server(e.server).fold_report(e)
            return
        timeline = self.timeline
        timeline.append(e)
        if timeline[0].time < self.last_time - self.timeline_s:
            self._trim_timeline()
        tally = e.tally  # counted calls only: no detail to show
        if not tally:
            self.log.append(e)
        if op == "clock":
            if e.key is not None:
                clocks = self.clocks.get(e.key) or self.clocks.setdefault(e.key, KeyClocks(e.key))
                clocks.fold(e)
            return
        if op == "round":
            columns = e.extra.get("round_columns") if e.key is None else None
            if columns is not None:
                self._fold_round_columns(e, columns)
                return
            for key, extra in round_rows(e):  # one key's round, or a server's record
                if key is None:
                    continue
                fan = self.fanin.get(key) or self.fanin.setdefault(key, FanIn(key))
                fan.report(e.server, e.time, extra)
                if extra.get("complete") and key in self.keys:
                    self.changed.add(key)  # the round's update is applied
                    self.server_changed.add(key)
            return
        if op == "failover":
            fold_failover(self.lost_reports, e)
            return
        if e.server is not None and op in ("push", "pull"):
            self._server(e.server).fold_traffic(e)
            if not e.first_piece:  # another slice of a push counted on slice 0's server:
                self._fold_piece(e.key, e.server, e.nbytes)  # only its bytes add
                return
        elif op == "push" and e.store.startswith("dist"):
            # a rank's own view of a push its servers report: only its rows count here
            if "rows" in e.extra:
                fold_rows(self.keys, e)
            return
        if e.key is None:
            if tally and "keys" in e.extra:
                self._fold_record(e)
            return
        stats = self._stats(e.key, e.server, op)
        if stats is None:
            return
        if e.shape and e.server is None:  # a server's event may be of one slice
            stats.shape, stats.dtype = e.shape, e.dtype or stats.dtype
        if "stype" in e.extra:  # an event of a row-sparse value
            stats.sparse = True
        # rows from the calls' own events: a server's receipt of a slice repeats them
        rows = e.extra.get("rows", 0) if e.server is None else 0
        if tally:
            self._fold_tally(stats, op, e.count, e.nbytes, e.summary, e.time, rows)
            return
        if op == "push":
            stats.pushes += count
            stats.bytes_in += e.nbytes
            stats.rows_in += rows
            # With no updater the stored value is the pushed sum; with one, the
            # update event (emitted before the push event) already set it.
            if e.server is None and not stats.has_updater and e.summary is not None:
                stats.value = e.summary
        elif op == "pull":
            stats.pulls += count
            stats.bytes_out += e.nbytes
            stats.rows_out += rows
            if e.summary is not None and e.server is None and not stats.on_servers:
                stats.value = e.summary
        elif op == "init":
            stats.inits += 1
            stats.value = e.summary
        elif op in UPDATER_OPS:
            stats.updates += count
            stats.has_updater = True
            if not stats.on_servers:
                stats.value = e.after
            self.trace.append(e)
            self.updates_detailed += 1
        if op in CHANGING_OPS:
            if e.time >= stats.last_change:  # batches from other processes come late
                stats.last_op, stats.last_change = op, e.time
            self.changed.add(e.key)

    def _fold_round_columns(self, e: Event, columns: list[list[Any]]) -> None:
        """A server's record of many keys' rounds (:mod:`labkv.events._round_records`),
        folded without a dict per key: at 64 ranks a record may hold 500 keys,
        10 a second from each server."""
        fanin, keys, workers, server, when = (
            self.fanin,
            self.keys,
            e.extra["num_workers"],
            e.server,
            e.time,
        )
        completed = []
        for key, number, pushed, missing, waited, complete in zip(*columns):
            fan = fanin.get(key) or fanin.setdefault(key, FanIn(key))
            fan.report_masks(server, when, number, workers, pushed, missing, waited, complete)
            if complete and key in keys:
                completed.append(key)  # the round's update is applied
        self.changed.update(completed)
        self.server_changed.update(completed)

    def _trim_timeline(self) -> None:
        """Forget the timeline's events older than ``timeline_s`` before the newest
        (in arrival order: an event that came late may stay a little longer)."""
        timeline, since = self.timeline, self.last_time - self.timeline_s
        while timeline and timeline[0].time < since:
            timeline.popleft()

    def held_s(self) -> float:
        """The seconds of events the timeline can show: ``timeline_s``, or less
        once ``timeline_size`` events cut it short.

        >>> model = MonitorModel(timeline_size=3, timeline_s=60.0)
        >>> for t in range(5):
        ...     model.on_event(Event(t, float(t), "s", "push", "w"))
        >>> _ = model.flush()
        >>> model.held_s(), [e.time for e in model.timeline]
        (2.0, [2.0, 3.0, 4.0])
        >>> model = MonitorModel(timeline_s=2.5)
        >>> for t in range(5):
        ...     model.on_event(Event(t, float(t), "s", "push", "w"))
        >>> _ = model.flush()
        >>> model.held_s(), [e.time for e in model.timeline]
        (2.5, [2.0, 3.0, 4.0])
        """
        with self.lock:
            ring = self.timeline
            if ring and len(ring) == ring.maxlen:
                return min(self.timeline_s, ring[-1].time - ring[0].time)
            return self.timeline_s

    def _stats(self, key: Key, server: Any, op: str) -> KeyStats | None:
        """The stats of ``key`` (new ones while fewer than ``max_keys`` are
        tracked), marked as held by servers when a server's ``op`` changes it."""
        stats = self.keys.get(key)
        if stats is None:
            if len(self.keys) >= self.max_keys:
                self.dropped_keys += 1
                return None
            stats = self.keys[key] = KeyStats(key)
        if server is not None and op in CHANGING_OPS:
            stats.on_servers = True
            self.server_changed.add(key)
        return stats

    def _fold_record(self, e: Event) -> None:
        """A record of the calls the bus only counted, of many keys at once
        (:func:`labkv.events.compact_rows`); a server's push record says per key
        whether its slice is slice 0 (``first``), so that each push counts once
        (the other slices add only their bytes).
        The common cases (pulls and pushes of keys already seen, with no value)
        are folded here in one loop: a record may hold 500 keys, 100 a second."""
        op, server, when, x = e.op, e.server, e.time, e.extra
        first = x.get("first")
        keys, changing = self.keys, op in CHANGING_OPS
        on_servers = server is not None and changing
        plain = op in ("push", "pull") and not x.get("summaries")
        if plain and self._fold_known(op, x, first, on_servers, when):
            return
        rows = x.get("rows") or itertools.repeat(0)
        folded: list[Key] = []  # the keys a changing op folded here
        for i, ((key, count, nbytes, summary), moved) in enumerate(zip(compact_rows(e), rows)):
            if first is not None and not first[i]:
                self._fold_piece(key, server, nbytes)
                continue
            stats = keys.get(key) if plain else None
            if stats is None:
                stats = self._stats(key, server, op)
                if stats is not None:
                    self._fold_tally(stats, op, count, nbytes, summary, when, moved)
                continue
            if op == "pull":
                stats.pulls += count
                stats.bytes_out += nbytes
                stats.rows_out += moved
                continue
            stats.pushes += count
            stats.bytes_in += nbytes
            stats.rows_in += moved
            stats.last_op, stats.last_change = op, when
            folded.append(key)
            if on_servers:
                stats.on_servers = True
        self.changed.update(folded)
        if on_servers:
            self.server_changed.update(folded)

    def _fold_known(
        self, op: str, x: dict[str, Any], first: list[bool] | None, on_servers: bool, when: float
    ) -> bool:
        """:meth:`_fold_record` of a push or pull record whose keys are all known
        (the usual record of a busy run), one column at a time: False (nothing
        done) when a key is new."""
        key_column, counts, nbytes = x["keys"], x["counts"], x["nbytes"]
        rows = x.get("rows")
        stats = list(map(self.keys.get, key_column))
        if not all(stats):  # a new key (None); a KeyStats is always true
            return False
        if first is not None:  # a server's record: only slice 0 counts a push
            for s, n, counted in zip(stats, nbytes, first):
                if not counted:  # another slice's bytes are the push's too
                    s.bytes_in += n
            stats, counts, nbytes = (list(compress(c, first)) for c in (stats, counts, nbytes))
            key_column = list(compress(key_column, first))
            rows = None if rows is None else list(compress(rows, first))
        if op == "pull":
            for s, count, n in zip(stats, counts, nbytes):
                s.pulls += count
                s.bytes_out += n
            if rows and any(rows):
                for s, moved in zip(stats, rows):
                    s.rows_out += moved
            return True
        for s, count, n in zip(stats, counts, nbytes):
            s.pushes += count
            s.bytes_in += n
            s.last_op, s.last_change = op, when
        if rows and any(rows):
            for s, moved in zip(stats, rows):
                s.rows_in += moved
        self.changed.update(key_column)
        if on_servers:
            for s in stats:
                s.on_servers = True
            self.server_changed.update(key_column)
        return True

    def _fold_piece(self, key: Key | None, server: Any, nbytes: int) -> None:
        """A server's receipt of a slice other than slice 0 of a push of ``key``: the
        push is counted on slice 0's server, but its bytes are the sum of every
        slice's (a row-sparse piece holds its server's rows and their ids)."""
        stats = None if key is None else self._stats(key, server, "push")
        if stats is not None:
            stats.bytes_in += nbytes

    def _fold_tally(
        self,
        stats: KeyStats,
        op: str,
        count: int,
        nbytes: int,
        summary: Summary | None,
        when: float,
        rows: int = 0,
    ) -> None:
        """Calls the bus only counted: counts, bytes and rows, no values."""
        if op == "push":
            stats.pushes += count
            stats.bytes_in += nbytes
            stats.rows_in += rows
        elif op == "pull":
            stats.pulls += count
            stats.bytes_out += nbytes
            stats.rows_out += rows
        elif op in UPDATER_OPS:
            stats.updates += count
        if summary is not None and not stats.on_servers:
            stats.value = summary
        if op in CHANGING_OPS:
            stats.last_op, stats.last_change = op, when
            self.changed.add(stats.key)

    def _server(self, server: Any) -> ServerLoad:
        load = self.servers.get(server)
        if load is None:
            load = self.servers[server] = ServerLoad(server, history=deque(maxlen=self._history))
        return load

    # -- queries (call flush() first) ------------------------------------------
    def events(self, key: Any = None, op: str | None = None, limit: int = 50) -> list[Event]:
        """Logged events, newest first by their time (whichever process sent them),
        optionally only one key and/or one op.

        >>> model = MonitorModel()
        >>> for i, op in enumerate(["init", "push", "pull"]):
        ...     model.on_event(Event(i, float(i), "s", op, "w"))
        >>> _ = model.flush()
        >>> [e.op for e in model.events(op="push")], [e.seq for e in model.events()]
        (['push'], [2, 1, 0])
        """
        if limit <= 0:
            return []
        with self.lock:
            # reversed: of events with the same time, the newest arrival comes first
            log = reversed(self.log)
            found = [e for e in log if (key is None or e.key == key) and (op is None or e.op == op)]
        # Servers' and ranks' events arrive in batches, after the notebook's own:
        # the log is in arrival order, the view in the order things happened.
        found.sort(key=lambda e: e.time, reverse=True)
        return found[:limit]

    def take_server_changed(self, limit: int) -> list[Key]:
        """Up to ``limit`` keys whose value servers changed since their last read
        (and forget those); the rest wait for the next call."""
        with self.lock:
            keys = list(itertools.islice(self.server_changed, limit))
            self.server_changed.difference_update(keys)
        return keys

    def set_value(self, key: Key, summary: Summary) -> None:
        """The value summary of ``key`` as read from the store."""
        with self.lock:
            stats = self.keys.get(key)
            if stats is not None and stats.value != summary:
                stats.value = summary
                self.version += 1

    def take_changed(self) -> set[Key]:
        """Keys whose value may have changed since the last call (and forget them)."""
        with self.lock:
            changed, self.changed = self.changed, set()
        return changed
