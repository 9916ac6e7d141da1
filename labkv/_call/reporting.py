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

import operator
from operator import itemgetter
from typing import Any

import numpy as np

from .._types import Key
from ..devices import device_of
from ..events import EventBus
from ..events._summary import summarize, summarize_sum
from ..sparse import RowSparseArray, sum_rows

Items = list[tuple[Key, list[Any]]]
#: an item's key, its arrays; the first of those
_KEY, _ARRAYS, _FIRST = itemgetter(0), itemgetter(1), itemgetter(0)


class Reporting:
    """The events of a store's calls (see module doc)."""

    events: EventBus
    rank: int
    _meta: dict[Key, tuple[tuple[int, ...], np.dtype]]
    _sizes: dict[Key, int]

    def _report_push(self, items: Items, start: float) -> None:
        events, rank, sizes = self.events, self.rank, self._sizes
        if len(items) > 1 and RowSparseArray not in set(
            map(type, map(_FIRST, map(_ARRAYS, items)))
        ):
            # many keys: counted with one check of the bus's budget (EventBus.count_keys)
            keys, nbytes = self._keys_and_bytes(items)
            for i, count, total in events.count_keys("push", keys, nbytes, rank):
                self._emit_push(keys[i], items[i][1], count, total, start)
            self._report_held_events()
            return
        for k, values in items:
            if isinstance(values[0], RowSparseArray):  # the bytes and rows moved
                moved = sum(v.nbytes for v in values)
                rows = sum(len(v.indices) for v in values)
                counted = events.admit_rows("push", k, moved, rows, rank, len(values))
                if counted:
                    self._emit_push(k, values, *counted[:2], start, rows=counted[2])
                continue
            nbytes = sizes.get(k) or self._nbytes(k)
            admitted = events.count("push", k, nbytes, len(values), rank)
            if admitted:
                self._emit_push(k, values, *admitted, start)
        self._report_held_events()

    def _report_pull(
        self,
        items: Items,
        start: float,
        moved: list[int] | None = None,
        rows: list[int] | None = None,
    ) -> None:
        """Report the pulls of ``items``; ``moved``: per key, the bytes moved, where
        that is not one whole value per out (a ``row_sparse_pull``), and ``rows``
        the rows it moved."""
        events, rank, sizes = self.events, self.rank, self._sizes
        if rows is not None and moved is not None:
            for (k, outs), nbytes, n in zip(items, moved, rows, strict=True):
                counted = events.admit_rows("pull", k, nbytes, n, rank, len(outs))
                if counted:
                    self._emit_pull(k, outs, *counted[:2], start, rows=counted[2])
            return
        if moved is None and len(items) > 1:  # many keys: see _report_push
            keys, nbytes = self._keys_and_bytes(items)
            for i, count, total in events.count_keys("pull", keys, nbytes, rank):
                self._emit_pull(keys[i], items[i][1], count, total, start)
            return
        for i, (k, outs) in enumerate(items):
            if moved is not None:
                admitted = events.admit("pull", k, moved[i], rank, units=len(outs))
            else:
                nbytes = sizes.get(k) or self._nbytes(k)
                admitted = events.count("pull", k, nbytes, len(outs), rank)
            if admitted:
                self._emit_pull(k, outs, *admitted, start)

    def _emit_pull(
        self,
        key: Key,
        outs: list[Any],
        count: int,
        nbytes: int,
        start: float,
        rows: int | None = None,
    ) -> None:
        extra: dict[str, Any] = {"start": start}
        shape = {}
        if rows is not None:  # a row_sparse_pull: outs[0] holds the rows, not the value
            extra["rows"] = rows  # the rows moved (and those of the calls it stands for)
            shape = {"shape": self._meta[key][0]}
        self.events.emit(
            "pull",
            key,
            outs[0],
            rank=self.rank,
            devices=tuple(str(device_of(o)) for o in outs),
            count=count,
            nbytes=nbytes,
            extra=extra,
            **shape,
        )

    def _keys_and_bytes(self, items: Items) -> tuple[list[Key], list[int]]:
        """The keys of a call of many keys, and the bytes of each key's arrays, made
        with C loops (this runs on every watched call, of up to hundreds of keys)."""
        keys = list(map(_KEY, items))
        nbytes = list(map(self._sizes.get, keys))
        if None in nbytes:
            nbytes = [self._nbytes(k) for k in keys]
        arrays = list(map(len, map(_ARRAYS, items)))
        if arrays.count(1) != len(arrays):
            nbytes = list(map(operator.mul, nbytes, arrays))
        return keys, nbytes

    def _nbytes(self, key: Key) -> int:
        """Bytes of one array of ``key`` (cached: this runs on every watched call)."""
        nbytes = self._sizes.get(key)
        if nbytes is None:
            shape, dtype = self._meta[key]
            nbytes = self._sizes[key] = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return nbytes

    def _emit_push(
        self,
        key: Key,
        values: list[Any],
        count: int,
        nbytes: int,
        start: float = 0.0,
        rows: int | None = None,
    ) -> None:
        per_device = [summarize(v) for v in values]
        if len(values) == 1:
            total = per_device[0]
        elif isinstance(values[0], RowSparseArray):
            total = summarize(sum_rows(values, values[0].dtype, device_of(values[0])))
        else:
            total = summarize_sum(values)
        self.events.emit(
            "push",
            key,
            values[0],
            rank=self.rank,
            devices=tuple(str(device_of(v)) for v in values),
            nbytes=nbytes,
            count=count,
            summary=total,
            extra={"per_device": per_device, "start": start}
            | ({} if rows is None else {"rows": rows}),
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
