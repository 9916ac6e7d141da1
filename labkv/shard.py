"""The state of a set of keys, and the one place where update semantics live.

A :class:`Shard` holds stored values, the updater or optimizer, and the
optimizer's per-key states. The local store keeps all keys in one shard; a
cluster server keeps its part of the keys in one. ``apply`` takes, for each
key, the list of values to add up (per-device values locally, per-worker
values on a server) and then:

- with no updater (ASSIGN): stores their sum, summed straight into the stored
  array (no temporary);
- with an optimizer: sums them into a merge buffer, then runs one optimizer step;
- with a custom updater ``fn(key, merged, stored)``: runs it on a copy of the
  stored value and keeps the copies only when every key of the call succeeded,
  so an updater that raises changes nothing.

Row-sparse values (:class:`~labkv.sparse.RowSparseArray`) are summed by the union
of their rows. With no updater a row-sparse key's value becomes that sum (as
MXNet's, the rows not pushed are gone) and a dense key's value its dense form; an
optimizer gets the row-sparse sum (its lazy rule, :meth:`Optimizer.update_rows`),
a row-sparse weight first held with all its rows (MXNet requires them); a custom
updater gets it as it is.

>>> import numpy as np
>>> shard = Shard()
>>> shard.init(3, np.zeros(2, dtype=np.float32))
>>> shard.apply([(3, [np.ones(2), np.ones(2)])])
>>> shard.read(3)
array([2., 2.], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Sequence
from typing import Any

from ._types import Key
from .devices import copy_into, device_of, empty, empty_like, on_device, to_device
from .events import EventBus, summarize
from .reduce import sum_into
from .sparse import RowSparseArray, cast_storage, sum_rows
from .sparse._row_ops import arange_rows, put_rows

Updater = Callable[[Key, Any, Any], Any]


def check_new_keys(keys: Iterable[Key], known: Container[Key]) -> None:
    """Raise ``ValueError`` for the first of ``keys`` that is already initialised
    (in ``known``) or appears twice: the one "already initialised" rule, used by
    a store's ``init`` (whole call, before anything changes) and by every shard.

    >>> check_new_keys([1, 2], known={3})
    >>> check_new_keys([1, 3], known={3})
    Traceback (most recent call last):
    ...
    ValueError: key 3 is already initialised
    """
    seen: set[Key] = set()
    for key in keys:
        if key in known:
            raise ValueError(f"key {key!r} is already initialised")
        if key in seen:
            raise ValueError(f"key {key!r} appears twice in one init call")
        seen.add(key)


class Shard:
    """Values, updater and optimizer states of a set of keys (see module doc)."""

    def __init__(
        self,
        events: EventBus | None = None,
        rank: int = 0,
        server: int | None = None,
        defer_events: bool = False,
    ):
        self.values: dict[Key, Any] = {}
        self.updater: Updater | None = None
        self.optimizer: Any = None
        self.states: dict[Key, Any] = {}
        # The updater or optimizer came from a rank that does not own the store
        # (a cluster server's rules: the owner's equal optimizer keeps it).
        self.provisional = False
        # Per sender, the id of the last setting call taken: a call made again
        # after a failover (it may have reached this replica already) is taken once.
        self.last_setting: dict[str, str] = {}
        self.events = events
        self.rank = rank
        self.server = server
        self._merge_buffers: dict[Key, Any] = {}
        # With defer_events, update events wait in here until flush_events(), so a
        # store can report the push first and the update it caused second.
        self.defer_events = defer_events
        self.deferred: list[tuple[tuple, dict]] = []

    def __contains__(self, key: Key) -> bool:
        return key in self.values

    def init(self, key: Key, value: Any) -> None:
        """Store ``value`` (owned by the shard from now on) under a new key."""
        check_new_keys([key], self.values)
        self.values[key] = value

    def read(self, key: Key) -> Any:
        """The stored array itself (callers copy it out)."""
        return self.values[key]

    def relocate(self, key: Key, value: Any) -> None:
        """Replace a key's array by an equal one elsewhere (e.g. on its home GPU);
        its optimizer states move along (the optimizer works on both at once)."""
        self.values[key] = value
        self._merge_buffers.pop(key, None)
        if key in self.states:
            device = device_of(value)
            self.states[key] = tuple(to_device(s, device, copy=False) for s in self.states[key])

    def take(self, values: dict[Key, Any], last_setting: dict[str, str]) -> None:
        """Become a copy of another shard's ``values`` (owned by this shard from now
        on) and of its ``last_setting`` (a replica seeded from its primary): keys
        not in ``values`` are dropped, with their buffers and optimizer states."""
        for key in [k for k in self.values if k not in values]:
            del self.values[key]
            self._merge_buffers.pop(key, None)
            self.states.pop(key, None)
        for key, value in values.items():
            if key in self.values:
                self.relocate(key, value)
            else:
                self.values[key] = value
        self.last_setting = dict(last_setting)

    def set_updater(self, updater: Updater | None, provisional: bool = False) -> None:
        """Use ``updater(key, merged, stored)`` from now on (None: back to ASSIGN);
        ``provisional``: it comes from a rank that does not own the store."""
        self.updater = updater
        self.optimizer = None
        self.provisional = provisional

    def export_states(self) -> tuple[int, dict[Key, int], dict[Key, tuple]]:
        """The optimizer's ``(num_update, per-key update counts, per-key states)``:
        the one place states leave a shard (a state file, a server's reply).

        >>> from labkv.optimizers import SGD
        >>> import numpy as np
        >>> shard = Shard()
        >>> shard.init("w", np.zeros(2, np.float32))
        >>> shard.set_optimizer(SGD(learning_rate=0.1, momentum=0.9))
        >>> shard.apply([("w", [np.ones(2, np.float32)])])
        >>> shard.export_states()[:2]
        (1, {'w': 1})
        """
        optimizer = self.optimizer
        return optimizer.num_update, dict(optimizer.index_update_count), dict(self.states)

    def import_states(
        self, num_update: int, counts: dict[Key, int], states: dict[Key, tuple]
    ) -> None:
        """Set what :meth:`export_states` gave (states from any device or the host
        are placed beside each key's value): the one place states enter a shard."""
        placed = {
            key: tuple(_placed_beside(self.values[key], array) for array in state)
            for key, state in states.items()
        }
        self.optimizer.num_update = num_update
        self.optimizer.index_update_count = dict(counts)
        self.states = placed

    def set_optimizer(self, optimizer: Any, provisional: bool = False) -> None:
        """Run ``optimizer`` on every push from now on; states start fresh.
        ``provisional``: it comes from a rank that does not own the store."""
        self.optimizer = optimizer
        self.updater = None
        self.states = {}
        self.provisional = provisional

    def _merged(self, key: Key, values: Sequence[Any], owned: bool = False) -> Any:
        stored = self.values[key]
        if isinstance(values[0], RowSparseArray):
            merged = self._merge_buffers[key] = sum_rows(values, stored.dtype, device_of(stored))
            return merged
        kept = self._keepable(key, values) if owned else None
        if kept is not None:
            self._merge_buffers[key] = kept
            return kept
        buffer = self._merge_buffers.get(key)
        if buffer is None:
            buffer = self._merge_buffers[key] = empty_like(stored)
        sum_into(buffer, values)
        return buffer

    def merged(self, key: Key) -> Any:
        """The sum the last update of ``key`` used (its merge buffer; with no
        updater, the stored value itself): what a replica applies to make the
        same update (``apply([(key, [merged])])`` gives the same bits)."""
        if self.optimizer is None and self.updater is None:
            return self.values[key]
        return self._merge_buffers[key]

    def apply(self, batch: Sequence[tuple[Key, Sequence[Any]]], owned: bool = False) -> None:
        """Apply one push: for every ``(key, values)``, add up ``values`` and
        update the key once (see module doc). Keys must be initialised and
        shapes checked by the caller.

        ``owned``: the values are the shard's to keep (a replica's log entry,
        fresh off the wire), so a key's single value of the stored type, dtype,
        shape and device is kept as it is, as the stored value (no updater) or
        the merge buffer, instead of being copied into them: same bits, one
        copy fewer of every big value a backup applies.

        >>> import numpy as np
        >>> shard = Shard()
        >>> shard.init("w", np.zeros(2, np.float32))
        >>> sent = np.ones(2, np.float32)
        >>> shard.apply([("w", [sent])], owned=True)
        >>> shard.read("w") is sent
        True
        """
        self.deferred.clear()
        if self.optimizer is not None:
            self._apply_optimizer(batch, owned)
        elif self.updater is not None:
            self._apply_updater(batch, owned)
        else:
            for key, values in batch:
                if isinstance(values[0], RowSparseArray):
                    self._assign_rows(key, values)
                    continue
                kept = self._keepable(key, values) if owned else None
                if kept is None:
                    sum_into(self.values[key], values)
                else:
                    self.values[key] = kept

    def _assign_rows(self, key: Key, values: Sequence[RowSparseArray]) -> None:
        stored = self.values[key]
        merged = sum_rows(values, stored.dtype, device_of(stored))
        if isinstance(stored, RowSparseArray):
            self.values[key] = merged
            return
        with on_device(device_of(stored)):
            stored.fill(0)
        put_rows(stored, merged.indices, merged.data)

    def _dense_weight(self, key: Key) -> Any:
        """The dense array an optimizer updates for ``key``: the value itself, or the
        data of a row-sparse value, first given all its rows (absent rows are zero)."""
        weight = self.values[key]
        if not isinstance(weight, RowSparseArray):
            return weight
        if len(weight.indices) != weight.shape[0]:
            rows = arange_rows(weight.shape[0])
            weight = self.values[key] = RowSparseArray(
                cast_storage(weight, "default"), rows, weight.shape
            )
        return weight.data

    def _keepable(self, key: Key, values: Sequence[Any]) -> Any:
        """The single value of ``values`` when it can stand in for the stored
        value of ``key`` (or its merge buffer), else None."""
        if len(values) != 1:
            return None
        value, stored = values[0], self.values[key]
        alike = (
            type(value) is type(stored)
            and value.dtype == stored.dtype
            and value.shape == stored.shape
            and value.flags.c_contiguous
            and getattr(value.flags, "writeable", True)  # CuPy arrays have no such flag
            and device_of(value) == device_of(stored)
        )
        return value if alike else None

    def _apply_optimizer(self, batch: Sequence[tuple[Key, Sequence[Any]]], owned: bool) -> None:
        optimizer, events = self.optimizer, self.events
        watch = events is not None and events.active
        # a server's steps once the op's detail is used up: counted for the whole batch
        counted: tuple[list[Key], list[int]] = ([], [])
        for key, values in batch:
            weight = self._dense_weight(key)
            grad = self._merged(key, values, owned)
            admitted = None
            if watch and self.server is not None and events.used_up("optimizer"):
                counted[0].append(key)
                counted[1].append(grad.nbytes)
            elif watch:
                admitted = events.admit("optimizer", key, int(grad.nbytes), self.rank, self.server)
            before = summarize(weight) if admitted else None
            with on_device(device_of(weight)):  # states and temporaries beside the weight
                if key not in self.states:
                    self.states[key] = optimizer.create_state(key, weight)
                if isinstance(grad, RowSparseArray):
                    optimizer.update_rows(key, weight, grad, self.states[key])
                else:
                    optimizer.update(key, weight, grad, self.states[key])
            if admitted:
                self._emit(
                    "optimizer", key, grad, before, weight, admitted, optimizer=optimizer.name
                )
        if counted[0]:
            events.counted("optimizer", *counted, self.server)

    def _apply_updater(self, batch: Sequence[tuple[Key, Sequence[Any]]], owned: bool) -> None:
        self.commit(self.prepare(batch, owned))

    def prepare(
        self, batch: Sequence[tuple[Key, Sequence[Any]]], owned: bool = False
    ) -> dict[Key, Any]:
        """Run the custom updater of every ``(key, values)`` on a copy of the
        stored value: ``{key: new value}``, to :meth:`commit`. If an updater
        raises, nothing is kept (the stored values never change). ``owned``:
        as in :meth:`apply`."""
        updated = {}
        for key, values in batch:
            merged = self._merged(key, values, owned)
            stored = self.values[key]
            with on_device(device_of(stored)):  # the copy and the updater's work beside it
                candidate = stored.copy()
                self.updater(key, merged, candidate)
            updated[key] = candidate
        return updated

    def commit(self, updated: dict[Key, Any]) -> None:
        """Store values made by :meth:`prepare` (every key at once) and report them."""
        previous = {key: self.values[key] for key in updated}
        self.values.update(updated)
        if self.events is None or not self.events.active:
            return
        for key, candidate in updated.items():
            merged = self._merge_buffers[key]
            admitted = self.events.admit("update", key, int(merged.nbytes), self.rank, self.server)
            if admitted:
                before = summarize(previous[key])
                self._emit("update", key, merged, before, candidate, admitted)

    def _emit(
        self,
        op: str,
        key: Key,
        merged: Any,
        before: Any,
        after: Any,
        admitted: tuple[int, int] = (1, 0),
        **extra: Any,
    ) -> None:
        count, nbytes = admitted
        fields = dict(
            rank=self.rank,
            server=self.server,
            before=before,
            after=summarize(after),
            extra=extra,
            count=count,
            nbytes=nbytes,
        )
        if self.defer_events:
            self.deferred.append(((op, key, merged), fields))
        else:
            self.events.emit(op, key, merged, **fields)

    def flush_events(self) -> None:
        """Emit the update events held back by ``defer_events``."""
        if not self.deferred:
            return
        deferred = list(self.deferred)
        self.deferred.clear()
        for args, fields in deferred:
            self.events.emit(*args, **fields)


def _placed_beside(value: Any, state: Any) -> Any:
    """A state array (from any device or the host) as a new array of ``value``'s
    dense shape and dtype, on its device (a row-sparse value's states are dense)."""
    placed = empty(value.shape, value.dtype, device_of(value))
    copy_into(placed, state.reshape(value.shape))
    return placed
