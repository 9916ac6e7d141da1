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
import math
import operator
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ._trace import export_trace, to_trace
from .devices import array_module, device_of, is_cupy, on_device, to_device

__all__ = [
    "Event",
    "EventBus",
    "Subscription",
    "export_trace",
    "summarize",
    "summarize_sum",
    "to_trace",
]

Key = int | str

#: calls a busy (op, key) is counted without reading the clock, once its window's
#: detailed events are used up: as many as its rate so far fills the rest of the
#: window with, within these bounds (a window ends at most one grant late)
_CREDITS_MIN, _CREDITS_MAX = 32, 1024

# The fields of a tally slot (a list, for cheap in-place counting): calls and bytes
# counted by admit(); calls and bytes reported in events so far; the current detail
# window's start, details used and calls before it; credits left for calls through
# admit(); the credits the store spends itself (`quick`): ``(iterator, granted)``, one
# tuple so that another thread reads both at once; the bytes of one such call.
(
    _CALLS,
    _BYTES,
    _REPORTED,
    _REPORTED_BYTES,
    _WINDOW,
    _USED,
    _WINDOW_CALLS,
    _CREDIT,
    _QUICK,
    _UNIT_BYTES,
) = range(10)

#: no credits: ``next(_SPENT, False)`` is False, so the store asks admit()
_SPENT = itertools.repeat(True, 0)
_NO_QUICK = (_SPENT, 0)


def _spent(quick: tuple[Any, int]) -> int:
    """Calls the store counted inline with a ``(credits, granted)`` grant."""
    credits, granted = quick
    return granted - operator.length_hint(credits) if granted else 0


def _report(slot: list, nbytes: int) -> tuple[int, int]:
    """Count one call of ``nbytes`` in ``slot`` and report it with the calls only
    counted since the last report: ``(count, nbytes)`` (under the tally lock)."""
    slot[_CALLS] += 1
    slot[_BYTES] += nbytes
    count, total = slot[_CALLS] - slot[_REPORTED], slot[_BYTES] - slot[_REPORTED_BYTES]
    slot[_REPORTED], slot[_REPORTED_BYTES] = slot[_CALLS], slot[_BYTES]
    return count, total


@dataclass(slots=True)
class Event:
    """One thing the store did.

    ``op`` is one of ``init``, ``push``, ``pull``, ``update`` (a custom
    updater call), ``optimizer`` (an optimizer step), ``barrier``, or a
    cluster op (``round``, ``server``, ``clock``: a dist_ssp pull's view of
    the ranks' clocks of a key and how long it waited). ``devices`` names where the values
    came from (push) or went to (pull); ``summary`` holds ``min/max/mean/norm``
    of the value the event is about; ``before``/``after`` the stored value's
    summary around an update.
    """

    seq: int
    time: float
    store: str
    op: str
    key: Key | None
    rank: int = 0
    devices: tuple[str, ...] = ()
    shape: tuple[int, ...] = ()
    dtype: str = ""
    nbytes: int = 0
    summary: dict[str, float] | None = None
    before: dict[str, float] | None = None
    after: dict[str, float] | None = None
    server: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    count: int = 1

    def to_dict(self) -> dict[str, Any]:
        """The event as plain Python data (JSON-able), e.g. to send it between processes."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        """Rebuild an event from :meth:`to_dict` output."""
        data = dict(data)
        data["devices"] = tuple(data.get("devices", ()))
        data["shape"] = tuple(data.get("shape", ()))
        return cls(**data)


def summarize(array: Any) -> dict[str, float]:
    """``min``, ``max``, ``mean`` and L2 ``norm`` of an array, as Python floats,
    computed on the array's own device (whichever GPU is current in the caller).

    >>> summarize(np.array([3.0, -4.0]))
    {'min': -4.0, 'max': 3.0, 'mean': -0.5, 'norm': 5.0}
    """
    if array.size == 0:
        return {"min": math.nan, "max": math.nan, "mean": math.nan, "norm": 0.0}
    # CuPy runs kernels on the *current* GPU and refuses operands that live on another:
    # callers (a shard's events, the monitor's thread, a server) may have any one current.
    with on_device(device_of(array)):
        return _summarize_here(array)


def _summarize_here(array: Any) -> dict[str, float]:
    xp = array_module(array)
    flat = array.reshape(-1)
    if flat.dtype.kind == "c":
        flat = xp.abs(flat)
    elif flat.dtype.kind != "f":
        flat = flat.astype(np.float64)
    # Min/max in the array's own dtype, the mean accumulated in float64 and the norm
    # from one dot product: no float64 copy of a float32 array (this runs per event).
    # A float16 dot product overflows from a norm of 256 on: its squares add in float32.
    squares = flat.astype(np.float32) if flat.dtype.itemsize < 4 else flat
    if xp is np:
        return {
            "min": float(flat.min()),
            "max": float(flat.max()),
            "mean": float(flat.mean(dtype=np.float64)),
            "norm": math.sqrt(float(np.vdot(squares, squares).real)),
        }
    # On a GPU: the four stats come to the host in one copy.
    stats = xp.stack(
        [
            flat.min().astype(np.float64),
            flat.max().astype(np.float64),
            flat.mean(dtype=np.float64),
            xp.sqrt(xp.vdot(squares, squares).real.astype(np.float64)),
        ]
    )
    stats = stats.get() if is_cupy(stats) else stats
    return dict(zip(("min", "max", "mean", "norm"), (float(s) for s in stats), strict=True))


def summarize_sum(values: Sequence[Any]) -> dict[str, float]:
    """:func:`summarize` of ``values[0] + values[1] + ...`` (arrays of one shape on
    any devices), added in float64 on the first one's device.

    >>> summarize_sum([np.ones(2, np.float32), np.full(2, 2.0)])
    {'min': 3.0, 'max': 3.0, 'mean': 3.0, 'norm': 4.242640687119285}
    """
    device = device_of(values[0])
    with on_device(device):
        total = values[0].astype(np.float64)
        for value in values[1:]:
            total += to_device(value, device, copy=False)
    return summarize(total)


class Subscription:
    """Handle returned by :meth:`EventBus.subscribe`; a context manager."""

    def __init__(
        self,
        bus: EventBus,
        callback: Callable[[Event], Any],
        detail_interval: float = 0.0,
        detail_burst: int = 1,
    ):
        self.bus = bus
        self.callback = callback
        self.detail_interval = detail_interval
        self.detail_burst = detail_burst

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

    def __init__(self, store_id: str, ring_size: int = 1000):
        self.store_id = store_id
        self.active = False
        self.detail_interval = 0.0
        self.detail_burst = 1
        self._recording = False
        self._subscribers: tuple[Subscription, ...] = ()
        self._ring: deque[Event] = deque(maxlen=ring_size)
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._tally_lock = threading.Lock()
        self._tallies: dict[tuple, list] = {}
        #: per op, key -> credits a store's hot path spends itself on calls of one
        #: array each (this bus's own rank): ``next(quick[op][key], False)`` is True
        #: for a call counted that way, False once they are spent (then it calls
        #: admit()); one C call per counted call, the cheapest count Python has.
        #: Every key admit() has seen is in here (a KeyError: a key's first call).
        self.quick: dict[str, dict[Key, Any]] = {"push": {}, "pull": {}}
        self.quick_push, self.quick_pull = self.quick["push"], self.quick["pull"]
        #: ``peek(key) -> array`` set by a store whose values can be read cheaply
        #: here; :meth:`flush` then gives tallied changes a fresh value summary.
        self.peek: Callable[[Key], Any] | None = None

    def subscribe(
        self,
        callback: Callable[[Event], Any],
        detail_interval: float = 0.0,
        detail_burst: int = 1,
    ) -> Subscription:
        """Call ``callback(event)`` for every event from now on.

        With ``detail_interval`` > 0 the subscriber says it needs at most
        ``detail_burst`` detailed events per op, key, rank and server in every
        ``detail_interval`` seconds (a live view refreshing at 10 Hz needs no
        more): further calls in that time are only counted, and the next event
        carries their ``count`` and bytes, or :meth:`flush` delivers them. This
        keeps a busy watched store fast while calls at human pace all arrive in
        detail. The bus follows the most demanding subscriber (interval 0:
        every call is an event).
        """
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        if detail_interval < 0 or detail_burst < 1:
            raise ValueError("detail_interval must be >= 0 and detail_burst >= 1")
        handle = Subscription(self, callback, float(detail_interval), int(detail_burst))
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
        wanted = [s.detail_interval for s in self._subscribers]
        self.detail_interval = 0.0 if self._recording or not wanted else min(wanted)
        self.detail_burst = max((s.detail_burst for s in self._subscribers), default=1)
        # Credits were granted under the old settings: take them back, so that the next
        # call of every key goes through admit() and follows the new ones (admit folds
        # what was counted inline; a credit spent meanwhile is still in its slot).
        for credits in self.quick.values():
            for key in list(credits):  # a store may be adding keys on its thread
                credits[key] = _SPENT
        for slot in list(self._tallies.values()):
            slot[_CREDIT] = 0

    def _changed(self) -> None:
        """Called after the subscribers or recording changed, outside the lock:
        a subclass may do slow work here (the cluster bus tells its servers),
        while events keep being delivered on other threads."""

    def admit(
        self,
        op: str,
        key: Key | None,
        nbytes: int,
        rank: int = 0,
        server: int | None = None,
        units: int = 1,
    ) -> tuple[int, int] | None:
        """Whether a call gets a detailed event now: ``(count, nbytes)`` of the
        calls that event stands for, or ``None`` when the call was only tallied
        (see ``detail_interval`` in :meth:`subscribe`). ``units`` is the number
        of arrays of the call (only calls of one array are counted inline by the
        store, see :attr:`quick`). Call it only when :attr:`active`.

        >>> bus = EventBus("s")
        >>> _ = bus.subscribe(lambda e: None, detail_interval=60)
        >>> bus.admit("push", 1, 8), bus.admit("push", 1, 8), bus.admit("push", 1, 8)
        ((1, 8), None, None)
        """
        interval = self.detail_interval
        slot = self._tallies.get((op, key, rank, server))
        if not interval:
            # Every call is an event; calls counted under earlier settings ride on it.
            return (1, nbytes) if slot is None else self._with_backlog(op, key, slot, nbytes)
        # Only the calling thread adds to a slot's calls and bytes, without a lock (the
        # common, cheap path); what was reported changes under the lock, here or in
        # flush(). Credits let a busy loop skip the clock: once a window's details are
        # used up, the next calls (a grant of credits) are counted without looking at
        # the time, by the store itself for calls of one array (see `quick`), else here.
        if slot is not None:
            if slot[_QUICK][1]:
                self._fold_quick(op, key, slot)
            if slot[_CREDIT] > 0:  # > 0: _refresh() may zero it between check and use
                slot[_CREDIT] -= 1
                slot[_CALLS] += 1
                slot[_BYTES] += nbytes
                return None
        now = time.monotonic()
        elapsed = now - slot[_WINDOW] if slot is not None else interval
        if elapsed < interval and slot[_USED] >= self.detail_burst:
            slot[_CALLS] += 1
            slot[_BYTES] += nbytes
            busy = slot[_CALLS] - slot[_WINDOW_CALLS]
            rate_fill = busy * (interval - elapsed) / max(elapsed, 1e-6)
            grant = min(max(int(rate_fill), _CREDITS_MIN), _CREDITS_MAX)
            if units == 1 and server is None and op in self.quick:
                credits = itertools.repeat(True, grant)
                slot[_UNIT_BYTES] = nbytes
                slot[_QUICK] = (credits, grant)
                self.quick[op][key] = credits
            else:
                slot[_CREDIT] = grant
            return None
        with self._tally_lock:
            if slot is None:
                slot = [1, nbytes, 1, nbytes, now, 1, 0, 0, _NO_QUICK, nbytes]
                self._tallies[(op, key, rank, server)] = slot
                if server is None and op in self.quick:
                    self.quick[op][key] = _SPENT  # the store's lookup finds it from now on
                return 1, nbytes
            if now - slot[_WINDOW] >= interval:
                slot[_WINDOW], slot[_USED], slot[_WINDOW_CALLS] = now, 0, slot[_CALLS]
            slot[_USED] += 1
            return _report(slot, nbytes)

    def _fold_quick(self, op: str, key: Key, slot: list) -> None:
        """Add the calls the store counted inline to the slot (the calling thread's
        job): clear the grant first (flush() may be reading), and take the spent
        credits away from the store's hot path."""
        quick, slot[_QUICK] = slot[_QUICK], _NO_QUICK
        self.quick[op][key] = _SPENT
        spent = _spent(quick)
        slot[_CALLS] += spent
        slot[_BYTES] += spent * slot[_UNIT_BYTES]

    def _with_backlog(self, op: str, key: Key, slot: list, nbytes: int) -> tuple[int, int]:
        """This call's ``(count, nbytes)`` plus those of the calls only counted so far."""
        if slot[_QUICK][1]:
            self._fold_quick(op, key, slot)
        with self._tally_lock:
            return _report(slot, nbytes)

    def flush(self) -> int:
        """Deliver the calls tallied since their last detailed event, as one
        ``count``-carrying event per op and key (``extra['tally']`` True, and
        ``summary`` the key's current value where the store lets the bus
        :attr:`peek`); returns how many events that made.

        >>> bus = EventBus("s"); got = []
        >>> _ = bus.subscribe(got.append, detail_interval=60)
        >>> for _ in range(3):
        ...     if bus.admit("push", 1, 8):
        ...         _ = bus.emit("push", 1, nbytes=8)
        >>> bus.flush(), [(e.count, e.nbytes) for e in got]
        (1, [(1, 8), (2, 16)])
        """
        due = []
        with self._tally_lock:
            for k, slot in list(self._tallies.items()):
                # calls and bytes before the inline count: a fold in between can only
                # make this total fall short for now, never count a call twice
                calls, nbytes = slot[_CALLS], slot[_BYTES]
                spent = _spent(slot[_QUICK])
                calls, nbytes = calls + spent, nbytes + spent * slot[_UNIT_BYTES]
                if calls > slot[_REPORTED]:
                    due.append((k, calls - slot[_REPORTED], nbytes - slot[_REPORTED_BYTES]))
                    slot[_REPORTED], slot[_REPORTED_BYTES] = calls, nbytes
        peek, summaries = self.peek, {}  # a key's pushes and pulls share one summary
        for (op, key, rank, server), count, nbytes in due:
            summary = None
            if peek is not None and server is None:
                if key not in summaries:
                    summaries[key] = summarize(peek(key))
                summary = summaries[key]
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
                extra={"tally": True},
            )
            self.deliver(event)
        return len(due)

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
