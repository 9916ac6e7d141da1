"""How a store reports its calls as events: the one place a store talks to its bus.

Every watched push and pull is counted with :meth:`~labkv.events.EventBus.count`;
only the calls the bus admits get a detailed event (with value summaries), the
others are counted by the bus and delivered by its ``flush()``. A push reports
its own event first, then the update events its backend held back
(:meth:`Reporting._report_held_events`). Nothing here runs unless the bus is
``active``.

>>> import labkv, numpy as np
>>> kv = labkv.create()
>>> kv.init("w", np.zeros(2)); kv.events.record()
>>> kv.push("w", [np.ones(2), np.ones(2)])
>>> e = kv.events.recent()[-1]
>>> e.op, e.count, e.nbytes, e.summary["mean"], len(e.extra["per_device"])
('push', 1, 32, 2.0, 2)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._summary import summarize, summarize_sum
from ._types import Key
from .devices import device_of
from .events import EventBus

Items = list[tuple[Key, list[Any]]]


class Reporting:
    """The events of a store's calls (see module doc)."""

    events: EventBus
    rank: int
    _meta: dict[Key, tuple[tuple[int, ...], np.dtype]]
    _sizes: dict[Key, int]

    def _report_push(self, items: Items, start: float) -> None:
        events, rank, sizes = self.events, self.rank, self._sizes
        for k, values in items:
            nbytes = sizes.get(k) or self._nbytes(k)
            admitted = events.count("push", k, nbytes, len(values), rank)
            if admitted:
                self._emit_push(k, values, *admitted, start)
        self._report_held_events()

    def _report_pull(self, items: Items, start: float) -> None:
        events, rank, sizes = self.events, self.rank, self._sizes
        for k, outs in items:
            nbytes = sizes.get(k) or self._nbytes(k)
            admitted = events.count("pull", k, nbytes, len(outs), rank)
            if admitted:
                events.emit(
                    "pull",
                    k,
                    outs[0],
                    rank=rank,
                    devices=tuple(str(device_of(o)) for o in outs),
                    count=admitted[0],
                    nbytes=admitted[1],
                    extra={"start": start},
                )

    def _nbytes(self, key: Key) -> int:
        """Bytes of one array of ``key`` (cached: this runs on every watched call)."""
        nbytes = self._sizes.get(key)
        if nbytes is None:
            shape, dtype = self._meta[key]
            nbytes = self._sizes[key] = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return nbytes

    def _emit_push(
        self, key: Key, values: list[Any], count: int, nbytes: int, start: float = 0.0
    ) -> None:
        per_device = [summarize(v) for v in values]
        total = per_device[0] if len(values) == 1 else summarize_sum(values)
        self.events.emit(
            "push",
            key,
            values[0],
            rank=self.rank,
            devices=tuple(str(device_of(v)) for v in values),
            nbytes=nbytes,
            count=count,
            summary=total,
            extra={"per_device": per_device, "start": start},
        )

    # -- what backends implement ---------------------------------------------------
    def _stored(self, key: Key) -> Any:
        """``key``'s stored array itself (no copy, no event), for the value summary
        of the calls :meth:`EventBus.flush` reports; ``None`` where the backend
        cannot read it cheaply in this process."""
        return None

    def _report_held_events(self) -> None:
        """Report the events the backend held back during a push (its updates),
        after the push's own; called only while someone watches."""
        return None
