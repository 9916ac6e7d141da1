"""Events: what the store did, for anyone who watches.

Every init, push, pull, updater call and optimizer step is reported as an
:class:`Event` on the store's :class:`EventBus` (``kv.events``). Nothing is
built when nobody listens: the store checks ``bus.active`` (a plain attribute)
before it makes an event, so an unwatched store pays one attribute read.

>>> import labkv, numpy as np
>>> kv = labkv.create("local")
>>> seen = []
>>> handle = kv.events.subscribe(seen.append)
>>> kv.init(3, np.ones((2, 3)))
>>> seen[0].op, seen[0].key, seen[0].shape
('init', 3, (2, 3))
>>> handle.unsubscribe()

Recorded events export as a Chrome / Perfetto trace (:func:`export_trace`,
:func:`to_trace`): one track per rank and per server.
"""

from __future__ import annotations

import itertools
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from .._types import Key
from ..devices import device_of
from ._event import COMPACT_AT, Event, compact_rows, per_key, round_extra, round_rows
from ._summary import summarize, summarize_sum
from ._tally import SPENT, Columns, Tallies
from ._trace import export_trace, to_trace

__all__ = [
    "COMPACT_AT",
    "Event",
    "EventBus",
    "Subscription",
    "compact_rows",
    "per_key",
    "round_extra",
    "round_rows",
    "export_trace",
    "summarize",
    "summarize_sum",
    "to_trace",
]


class Subscription:
    """Handle returned by :meth:`EventBus.subscribe`; a context manager."""

    def __init__(
        self,
        bus: EventBus,
        callback: Callable[[Event], Any],
        detail_interval: float = 0.0,
        detail_burst: int = 1,
        local_only: bool = False,
    ):
        self.bus = bus
        self.callback = callback
        self.detail_interval = detail_interval
        self.detail_burst = detail_burst
        self.local_only = local_only

    def unsubscribe(self) -> None:
        """Stop receiving events (idempotent)."""
        self.bus.unsubscribe(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unsubscribe()


class EventBus:
    """Fan-out of a store's events to subscribers, plus a ring of recent ones.

    ``active`` is True while anyone subscribes or :meth:`record` is on; the
    store builds events only then. Callbacks run on the thread that made the
    event (the caller's, or the Dask client's for cluster events) and must be
    quick; a callback that raises is reported as a warning and never breaks
    the store call.

    >>> bus = EventBus("demo", ring_size=2)
    >>> bus.record(True)
    >>> for i in range(3):
    ...     _ = bus.emit("push", i)
    >>> [e.key for e in bus.recent()]
    [1, 2]
    """

    def __init__(
        self,
        store_id: str,
        ring_size: int = 1000,
        read: Callable[[Key], Any] | None = None,
    ):
        self.store_id = store_id
        self.active = False
        self.remote = False
        self.detail_interval = 0.0
        self.detail_burst = 1
        self._recording = False
        self._subscribers: tuple[Subscription, ...] = ()
        self._ring: deque[Event] = deque(maxlen=ring_size)
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._tallies = Tallies()
        self._credits = self._tallies.credits
        #: called first by every :meth:`flush`: what owners of the bus keep to send
        #: then (a server's rounds, one record per key per flush)
        self.on_flush: list[Callable[[], None]] = []
        #: ``read(key) -> array or None``: a key's stored value, read without copying
        #: and without an event (the store's own); :meth:`flush` then gives the calls
        #: it reports a fresh value summary.
        self._read = read

    def subscribe(
        self,
        callback: Callable[[Event], Any],
        detail_interval: float = 0.0,
        detail_burst: int = 1,
        local_only: bool = False,
    ) -> Subscription:
        """Call ``callback(event)`` for every event from now on.

        With ``detail_interval`` > 0 the subscriber says it needs at most
        ``detail_burst`` detailed events per op, key, rank and server in every
        ``detail_interval`` seconds (a live view refreshing at 10 Hz needs no
        more): further calls in that time are only counted, and the next event
        carries their ``count`` and bytes, or :meth:`flush` delivers them. This
        keeps a busy watched store fast while calls at human pace all arrive in
        detail. The bus follows the most demanding subscriber (interval 0:
        every call is an event). A new subscriber hears only of calls made from
        now on: the calls the others' events have not carried yet are delivered
        to them first.

        ``local_only``: the subscriber needs only the events of the calls made
        in this process. A cluster store's servers (and the ranks of a run on
        it) still send theirs to the scheduler, but this process receives them
        only while another subscriber wants them (``labkv.dashboard.watch``:
        the scheduler folds them itself).

        >>> bus = EventBus("s"); first, second = [], []
        >>> _ = bus.subscribe(first.append, detail_interval=60)
        >>> def pull():
        ...     counted = bus.count("pull", "w", 8)
        ...     if counted:
        ...         _ = bus.emit("pull", "w", count=counted[0], nbytes=counted[1])
        >>> for _ in range(3):
        ...     pull()
        >>> _ = bus.subscribe(second.append)
        >>> pull()
        >>> [(e.count, e.tally) for e in first], [(e.count, e.nbytes) for e in second]
        ([(1, False), (2, True), (1, False)], [(1, 8)])
        """
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        if detail_interval < 0 or detail_burst < 1:
            raise ValueError("detail_interval must be >= 0 and detail_burst >= 1")
        handle = Subscription(
            self, callback, float(detail_interval), int(detail_burst), bool(local_only)
        )
        if self._subscribers:
            # The calls counted so far belong to the subscribers there are: delivered
            # now, they never ride on the new subscriber's first event of a key.
            self.flush()
        with self._lock:
            self._subscribers = (*self._subscribers, handle)
            self._refresh()
        self._changed()
        return handle

    def unsubscribe(self, handle: Subscription) -> None:
        """Remove a subscription (unknown handles are ignored)."""
        with self._lock:
            self._subscribers = tuple(s for s in self._subscribers if s is not handle)
            self._refresh()
        self._changed()

    def record(self, on: bool = True) -> None:
        """Keep recent events in the ring even with no subscriber."""
        with self._lock:
            self._recording = bool(on)
            self._refresh()
        self._changed()

    def _refresh(self) -> None:
        self.active = self._recording or bool(self._subscribers)
        # whether anything here wants the events other processes make
        self.remote = self._recording or any(not s.local_only for s in self._subscribers)
        wanted = [s.detail_interval for s in self._subscribers]
        self.detail_interval = 0.0 if self._recording or not wanted else min(wanted)
        self.detail_burst = max((s.detail_burst for s in self._subscribers), default=1)
        self._tallies.configure(self.detail_interval, self.detail_burst)

    def _changed(self) -> None:
        """Called after the subscribers or recording changed, outside the lock:
        a subclass may do slow work here (the cluster bus tells its servers),
        while events keep being delivered on other threads."""

    def count(
        self, op: str, key: Key | None, nbytes: int, n: int = 1, rank: int = 0
    ) -> tuple[int, int] | None:
        """Count a store's call of ``n`` arrays of ``nbytes`` each (``op`` is
        ``'push'`` or ``'pull'``, made in this process): ``(count, nbytes)`` when it gets a detailed event now
        (the caller then emits it with that ``count`` and ``nbytes``), ``None`` when
        it was only counted. The one method a store reports its calls through; the
        bus counts busy calls of one array without reading the clock (see
        ``labkv/events/_tally.py``). Call it only when :attr:`active`.

        >>> bus = EventBus("s")
        >>> _ = bus.subscribe(lambda e: None, detail_interval=60)
        >>> [bus.count("pull", "w", 8, n=2) for _ in range(3)]
        [(1, 16), None, None]
        """
        # The hot path of a watched busy store: one dict lookup per level and one C
        # call that spends a credit and counts the call at once (see _tally.py).
        if n == 1 and next(self._credits[op].get(key, SPENT), False):
            return None
        return self._tallies.admit(op, key, nbytes * n, rank, None, n)

    def count_keys(
        self, op: str, keys: list[Key], nbytes: list[int], rank: int = 0
    ) -> list[tuple[int, int, int]]:
        """:meth:`count` for a call of many keys (``nbytes[i]``: the bytes of
        ``keys[i]``, all its arrays): ``(i, count, nbytes)`` of the keys that get
        a detailed event now, the others only counted (once the op's detail is
        used up, with one check for the whole call).

        >>> bus = EventBus("s")
        >>> _ = bus.subscribe(lambda e: None, detail_interval=60, detail_burst=1)
        >>> bus.count_keys("pull", list(range(6)), [8] * 6)
        [(0, 1, 8), (1, 1, 8), (2, 1, 8), (3, 1, 8)]
        """
        return self._tallies.admit_keys(op, keys, nbytes, rank)

    @property
    def op_budget(self) -> int:
        """Per op, at most ``detail_burst`` x this many detailed events in every
        ``detail_interval``, whatever the keys (see ``labkv/events/_tally.py``): 4 by
        default; a cluster's event streams set 1 (each rank and server streams)."""
        return self._tallies.op_budget

    @op_budget.setter
    def op_budget(self, value: int) -> None:
        self._tallies.op_budget = int(value)

    def used_up(self, op: str) -> bool:
        """Whether ``op``'s detailed events of this interval are all handed out:
        its calls are only counted until the next (see :meth:`counted`)."""
        return bool(self.detail_interval) and self._tallies.used_up(op)

    def take_detail(self, op: str) -> bool:
        """Whether a call of ``op`` gets a detailed event now, by the op's budget
        alone (taking one): for events whose owner keeps what the others carry
        (a server's dist_ssp waits, sent as one record per key and flush)."""
        return self._tallies.take(op)

    def counted(self, op: str, keys: list[Key], nbytes: list[int], server: int | None) -> None:
        """Calls of ``op`` that their owner counted itself while :meth:`used_up`
        (a server's receipts: one list append each), reported at the next flush."""
        self._tallies.counted(op, keys, nbytes, server)

    def admit(
        self,
        op: str,
        key: Key | None,
        nbytes: int,
        rank: int = 0,
        server: int | None = None,
        units: int = 1,
    ) -> tuple[int, int] | None:
        """:meth:`count` for any call: an updater or optimizer step, a server's
        receipt of a push (``server``), ``nbytes`` in all for ``units`` arrays.

        >>> bus = EventBus("s")
        >>> _ = bus.subscribe(lambda e: None, detail_interval=60)
        >>> bus.admit("push", 1, 8), bus.admit("push", 1, 8), bus.admit("push", 1, 8)
        ((1, 8), None, None)
        """
        return self._tallies.admit(op, key, nbytes, rank, server, units)

    def admit_rows(
        self, op: str, key: Key | None, nbytes: int, rows: int, rank: int = 0, units: int = 1
    ) -> tuple[int, int, int] | None:
        """:meth:`admit` for a call that moved ``rows`` rows of a row-sparse value
        (a push of row-sparse gradients, a ``row_sparse_pull``): ``(count, nbytes,
        rows)`` of the calls its detailed event stands for (its ``extra["rows"]``);
        the calls only counted sum their rows as their bytes, and :meth:`flush`
        delivers them (``extra["rows"]``).

        >>> bus = EventBus("s"); got = []
        >>> _ = bus.subscribe(got.append, detail_interval=60)
        >>> [bus.admit_rows("pull", "e", 80, 10) for _ in range(3)]
        [(1, 80, 10), None, None]
        >>> bus.flush(), got[-1].count, got[-1].extra["rows"]
        (1, 2, 20)
        """
        return self._tallies.admit_rows(op, key, nbytes, rows, rank, None, units)

    def flush(self) -> int:
        """Deliver the calls counted since their last detailed event, as one
        ``count``-carrying event per op and key (:attr:`Event.tally` True, and
        ``summary`` the key's current value where the store lets the bus read
        it), or, for more than :data:`COMPACT_AT` keys of one op, one record
        for them all (:func:`compact_rows`); returns how many events that made.

        >>> bus = EventBus("s"); got = []
        >>> _ = bus.subscribe(got.append, detail_interval=60)
        >>> for _ in range(3):
        ...     if bus.count("push", 1, 8):
        ...         _ = bus.emit("push", 1, nbytes=8)
        >>> bus.flush(), [(e.count, e.nbytes, e.tally) for e in got]
        (1, [(1, 8, False), (2, 16, True)])
        """
        for hook in self.on_flush:
            hook()
        groups = self._tallies.due_groups()
        read, summaries = self._read, {}  # a key's pushes and pulls share one summary

        def summary_of(key: Key | None, server: int | None) -> dict[str, float] | None:
            if read is None or server is not None:
                return None
            if key not in summaries:
                value = read(key)
                summaries[key] = None if value is None else summarize(value)
            return summaries[key]

        made = 0
        for (op, rank, server), counted in groups.items():
            if len(counted) <= COMPACT_AT:
                for key, (count, nbytes, by, rows) in counted.items():
                    summary = summary_of(key, server)
                    moved = {"rows": rows} if rows else None
                    self._deliver_tally(op, key, by, server, count, nbytes, summary, moved)
                    made += 1
                continue
            if isinstance(counted, Columns):  # a rank's calls of the same keys
                keys, rows = counted.key_column, counted.rows
                extra: dict[str, Any] = {
                    "keys": keys,
                    "counts": counted.counts,
                    "nbytes": counted.nbytes,
                }
            else:
                keys = list(counted)
                extra = {
                    "keys": keys,
                    "counts": [counted[k][0] for k in keys],
                    "nbytes": [counted[k][1] for k in keys],
                }
                rows = [counted[k][3] for k in keys]
            if any(rows):  # rows of row-sparse values, summed as the bytes are
                extra["rows"] = rows
            if read is not None and server is None:
                values = [summary_of(k, server) for k in keys]
                if any(v is not None for v in values):  # a store that reads its values
                    extra["summaries"] = values
            count, nbytes = sum(extra["counts"]), sum(extra["nbytes"])
            self._deliver_tally(op, None, rank, server, count, nbytes, None, extra)
            made += 1
        return made

    def _deliver_tally(
        self,
        op: str,
        key: Key | None,
        rank: int,
        server: int | None,
        count: int,
        nbytes: int,
        summary: dict[str, float] | None,
        extra: dict[str, Any] | None,
    ) -> None:
        event = Event(
            next(self._seq),
            time.time(),
            self.store_id,
            op,
            key,
            rank=rank,
            server=server,
            nbytes=nbytes,
            count=count,
            summary=summary,
            tally=True,
            extra={} if extra is None else extra,
        )
        self.deliver(event)

    def recent(self, n: int | None = None) -> list[Event]:
        """The last ``n`` events kept (all of the ring when ``n`` is None), oldest first."""
        with self._lock:
            events = list(self._ring)
        return events if n is None else events[-n:] if n > 0 else []

    def clear(self) -> None:
        """Forget the recent events."""
        with self._lock:
            self._ring.clear()

    def emit(self, op: str, key: Key | None, value: Any = None, **fields: Any) -> Event | None:
        """Build and deliver one event; ``value`` (an array) fills shape,
        dtype, nbytes, summary and, unless given, devices."""
        if not self.active:
            return None
        if value is not None:
            fields.setdefault("shape", tuple(value.shape))
            fields.setdefault("dtype", str(value.dtype))
            fields.setdefault("nbytes", int(value.nbytes))
            if "devices" not in fields:
                fields["devices"] = (str(device_of(value)),)
            if "summary" not in fields:
                fields["summary"] = summarize(value)
            if getattr(value, "stype", "default") == "row_sparse":
                # a view tells row-sparse keys by this, and the rows a call moved
                extra = fields["extra"] = dict(fields.get("extra") or ())
                extra.setdefault("stype", "row_sparse")
                extra.setdefault("rows", len(value.indices))
        event = Event(next(self._seq), time.time(), self.store_id, op, key, **fields)
        self.deliver(event)
        return event

    def deliver(self, event: Event) -> None:
        """Hand an already built event (e.g. one that came from a server) to everyone."""
        with self._lock:
            self._ring.append(event)
            subscribers = self._subscribers
        for sub in subscribers:
            try:
                sub.callback(event)
            except Exception as exc:  # a broken view must not break the store
                warnings.warn(
                    f"labkv event subscriber {sub.callback!r} raised {exc!r}",
                    RuntimeWarning,
                    stacklevel=2,
                )

    def deliver_many(self, events: Iterable[Event]) -> None:
        """Deliver a batch of events in order."""
        for event in events:
            self.deliver(event)
