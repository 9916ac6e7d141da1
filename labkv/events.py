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
"""

from __future__ import annotations

import itertools
import math
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .devices import array_module, device_of, is_cupy

__all__ = ["Event", "EventBus", "Subscription", "summarize"]

Key = int | str


@dataclass(slots=True)
class Event:
    """One thing the store did.

    ``op`` is one of ``init``, ``push``, ``pull``, ``update`` (a custom
    updater call), ``optimizer`` (an optimizer step), ``barrier``, or a
    cluster op (``round``, ``server``). ``devices`` names where the values
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
    """``min``, ``max``, ``mean`` and L2 ``norm`` of an array, as Python floats.

    >>> summarize(np.array([3.0, -4.0]))
    {'min': -4.0, 'max': 3.0, 'mean': -0.5, 'norm': 5.0}
    """
    if array.size == 0:
        return {"min": math.nan, "max": math.nan, "mean": math.nan, "norm": 0.0}
    xp = array_module(array)
    values = array.astype(np.float64, copy=False)
    stats = xp.stack([values.min(), values.max(), values.mean(), xp.sqrt((values * values).sum())])
    stats = stats.get() if is_cupy(stats) else stats
    return dict(zip(("min", "max", "mean", "norm"), (float(s) for s in stats), strict=True))


class Subscription:
    """Handle returned by :meth:`EventBus.subscribe`; a context manager."""

    def __init__(self, bus: EventBus, callback: Callable[[Event], Any]):
        self.bus = bus
        self.callback = callback

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
        self._recording = False
        self._subscribers: tuple[Subscription, ...] = ()
        self._ring: deque[Event] = deque(maxlen=ring_size)
        self._seq = itertools.count()
        self._lock = threading.Lock()

    def subscribe(self, callback: Callable[[Event], Any]) -> Subscription:
        """Call ``callback(event)`` for every event from now on."""
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        handle = Subscription(self, callback)
        with self._lock:
            self._subscribers = (*self._subscribers, handle)
            self._refresh()
        return handle

    def unsubscribe(self, handle: Subscription) -> None:
        """Remove a subscription (unknown handles are ignored)."""
        with self._lock:
            self._subscribers = tuple(s for s in self._subscribers if s is not handle)
            self._refresh()

    def record(self, on: bool = True) -> None:
        """Keep recent events in the ring even with no subscriber."""
        with self._lock:
            self._recording = bool(on)
            self._refresh()

    def _refresh(self) -> None:
        self.active = self._recording or bool(self._subscribers)

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
            fields.setdefault("devices", (str(device_of(value)),))
            fields.setdefault("summary", summarize(value))
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
