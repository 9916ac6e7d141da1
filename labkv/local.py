"""The ``local`` and ``device`` stores: every key in one process, in one :class:`Shard`.

- ``local`` keeps values on the CPU and sums pushed values there (CuPy values
  are copied to the host first).
- ``device`` keeps a key pushed from GPUs on a home GPU, chosen to balance
  bytes across the GPUs that push it, and sums there; numpy values are summed
  on the CPU as with ``local``.

>>> import labkv, numpy as np
>>> kv = labkv.create("device")
>>> kv.init("w", np.zeros(2))
>>> kv.push("w", [labkv.ones(2, device=d) for d in labkv.devices(2)])
>>> kv.pull("w")
array([2., 2.])
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ._call.interrupts import sigint_held
from ._types import Key
from .devices import Device, copy_into, cpu, device_of, empty_like, to_device
from .optimizers import Optimizer
from .reduce import HomeDevices
from .shard import Shard
from .sparse import RowSparseArray, cast_storage
from .sparse import zeros as sparse_zeros
from .sparse._row_ops import gather, take_rows
from .store import Items, KVStore


class LocalStore(KVStore):
    """A store in this process (see module doc); make it with ``labkv.create``."""

    def __init__(self, kvtype: str = "local", name: str | None = None):
        super().__init__(kvtype, name)
        self._shard = Shard(self.events, defer_events=True)
        self._homes = HomeDevices()

    def _init_impl(self, items: list[tuple[Key, Any]]) -> None:
        placed = []
        for key, value in items:
            keep_on_gpu = self._kind == "device" and device_of(value).kind == "gpu"
            placed.append((key, to_device(value, device_of(value) if keep_on_gpu else cpu(0))))
        with sigint_held:  # every key or none, Ctrl-C or not
            for key, value in placed:
                self._shard.init(key, value)

    def _home_gpus(self, items: Items) -> None:
        """On a ``device`` store, move each key pushed from GPUs to its home GPU."""
        for key, values in items:
            gpus = [d for d in map(device_of, values) if d.kind == "gpu"]
            if not gpus or key in self._homes.home:
                continue
            stored = self._shard.read(key)
            home = self._homes.assign(key, int(stored.nbytes), gpus)
            if device_of(stored) != home:
                self._shard.relocate(key, to_device(stored, home))

    def _push_impl(self, items: Items) -> None:
        # A push of several keys changes all of them or none, Ctrl-C or not. A custom
        # updater runs on copies swapped in at the end (Shard), and stays interruptible.
        held = sigint_held if self._shard.updater is None else contextlib.nullcontext()
        with held:
            if self._kind == "device":
                self._home_gpus(items)
            self._shard.apply(items)

    def _pull_impl(self, items: Items) -> None:
        read = self._shard.read
        for key, outs in items:
            stored = read(key)
            if isinstance(stored, RowSparseArray) and not all(
                isinstance(o, RowSparseArray) for o in outs
            ):
                dense = cast_storage(stored, "default")
            for out in outs:
                if isinstance(out, RowSparseArray):
                    out[:] = stored
                else:
                    copy_into(out, dense if isinstance(stored, RowSparseArray) else stored)

    def _pull_rows(self, items: list[tuple[Key, np.ndarray]]) -> list[Any]:
        # Only the rows asked for are read (and counted in the events).
        start = time.time() if self.events.active else 0.0
        blocks = []
        for key, rows in items:
            stored = self._shard.read(key)
            if isinstance(stored, RowSparseArray):
                device = device_of(stored)
                blocks.append(gather(stored.data, stored.indices, rows, device, stored.dtype))
            else:
                blocks.append(take_rows(stored, rows))
        if self.events.active:
            moved = [int(b.nbytes) + int(rows.nbytes) for b, (_, rows) in zip(blocks, items)]
            pulled = [(k, [b]) for (k, _), b in zip(items, blocks, strict=True)]
            self._report_pull(pulled, start, moved, [len(rows) for _, rows in items])
        return blocks

    def _new_out(self, key: Key) -> Any:
        stored = self._shard.read(key)
        if isinstance(stored, RowSparseArray):
            return sparse_zeros("row_sparse", stored.shape, device_of(stored), stored.dtype)
        return empty_like(stored)

    def _set_updater_impl(self, updater: Callable) -> None:
        self._shard.set_updater(updater)

    def _set_optimizer_impl(self, optimizer: Optimizer) -> None:
        self._shard.set_optimizer(optimizer)

    def _optimizer_states(self) -> tuple[int, dict, dict]:
        return self._shard.export_states()

    def _load_optimizer_states(self, num_update: int, counts: dict, states: dict) -> None:
        self._shard.import_states(num_update, counts, states)

    def _barrier_impl(self) -> None:
        return None

    def _stored(self, key: Key) -> Any:
        return self._shard.read(key)

    def _report_held_events(self) -> None:
        if self._shard.deferred:  # checked here: this runs on every watched push
            self._shard.flush_events()

    def placement(self) -> dict[Key, list[dict[str, Any]]]:
        """Every key in one piece, on the device that holds it (see
        :meth:`KVStore.placement`).

        >>> import labkv, numpy as np
        >>> kv = labkv.create("device")
        >>> kv.init("w", labkv.ones(3, device=labkv.cpu(1)))
        >>> kv.placement()
        {'w': [{'server': None, 'device': 'cpu(0)', 'start': 0, 'stop': 3}]}
        """
        return {
            key: [
                {
                    "server": None,
                    "device": str(device_of(self._shard.read(key))),
                    "start": 0,
                    "stop": int(np.prod(shape, dtype=np.int64)),
                }
            ]
            for key, (shape, _) in self._meta.items()
        }

    def peek(self, key: Key) -> Any:
        """A copy of ``key``'s value (see :meth:`KVStore.peek`), on the device that
        holds it.

        >>> import labkv, numpy as np
        >>> kv = labkv.create()
        >>> kv.init(0, np.ones(2))
        >>> kv.peek(0)
        array([1., 1.])
        """
        self._check_known([key])
        return self._shard.read(key).copy()

    def home_device(self, key: Key) -> Device:
        """The device that holds ``key``'s value (its home GPU on a ``device`` store)."""
        self._check_known([key])
        return device_of(self._shard.read(key))
