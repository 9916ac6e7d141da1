"""The MXNet-compatible ``KVStore`` API, argument checks and events.

:class:`KVStore` turns every call into ``[(key, [arrays])]``, checks the whole
call (key types, initialisation, shapes, dtypes, lengths) before anything
changes, and reports events. Backends (the local store, the cluster worker
store) implement a handful of ``_methods``.

>>> import labkv, numpy as np
>>> kv = labkv.create("local")
>>> kv.init(3, np.ones((2, 3)) * 2)
>>> kv.push(3, [np.ones((2, 3)), np.ones((2, 3))])
>>> kv.pull(3)
array([[2., 2., 2.],
       [2., 2., 2.]])
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import _statefile
from ._args import (
    LengthMismatchError,
    group,
    merge_repeated,
    normalize_key,
    normalize_keys,
)
from .compression import GradientCompression
from .devices import array_module, copy_into, device_of, is_cupy
from .events import EventBus, summarize, summarize_sum
from .optimizers import Optimizer
from .optimizers import create as create_optimizer

Key = int | str
Items = list[tuple[Key, list[Any]]]


def _kind_name(kind: type) -> str:
    return kind.__name__


def _row_indices(key: Key, row_ids: Any, num_rows: int) -> np.ndarray:
    """``row_ids`` as a flat int64 array of rows of ``key``. Floats holding whole
    numbers are accepted (MXNet's ``nd.array`` makes float32 ids by default)."""
    rows = np.asarray(row_ids.get() if is_cupy(row_ids) else row_ids).reshape(-1)
    if rows.dtype.kind not in "iuf":
        raise TypeError(f"row_ids for key {key!r} must be real numbers, got {rows.dtype}")
    if rows.dtype.kind == "f":
        whole = np.isfinite(rows) & (rows == np.round(rows))
        if not whole.all():
            bad = rows[~whole][0].item()
            raise ValueError(f"row_ids for key {key!r} must be whole numbers; got {bad!r}")
    outside = (rows < 0) | (rows >= num_rows)
    if outside.any():
        bad = rows[outside][0].item()
        raise IndexError(f"row_ids for key {key!r} out of range [0, {num_rows}): got {bad!r}")
    return rows.astype(np.int64, copy=False)


class KVStore:
    """A key-value store for parameters and gradients, with MXNet's API.

    Use :func:`labkv.create` to make one. Keys are ``int`` or ``str`` (one
    kind per store); values are numpy or CuPy arrays, one per device, summed
    on push. Every failing call raises before it changes anything.
    """

    def __init__(self, kvtype: str, name: str | None = None):
        self._kind = kvtype  # the labkv store type: what the backend does
        self._type = name or kvtype  # the name the user gave (MXNet's kv.type)
        self._id = f"{kvtype}-{uuid.uuid4().hex[:8]}"
        self.events = EventBus(self._id)
        self._meta: dict[Key, tuple[tuple[int, ...], np.dtype]] = {}
        self._sizes: dict[Key, int] = {}
        self._key_kind: type | None = None
        self._compression: GradientCompression | None = None
        self._optimizer: Optimizer | None = None
        self._updater: Callable | None = None

    # -- identity --------------------------------------------------------
    @property
    def type(self) -> str:
        """The store's type as given to ``create`` (lower-cased), e.g. ``'local'``."""
        return self._type

    @property
    def rank(self) -> int:
        """This worker's rank (0 on one machine)."""
        return 0

    @property
    def num_workers(self) -> int:
        """The number of workers sharing the store (1 on one machine)."""
        return 1

    def is_capable(self, capability: str) -> bool:
        """Whether the store supports ``capability`` (``'optimizer'``)."""
        return capability.lower() == "optimizer"

    def barrier(self) -> None:
        """Wait until every worker reaches this point (nothing to wait for locally)."""
        self._barrier_impl()

    _barrier = barrier

    def keys(self) -> list[Key]:
        """The initialised keys, in initialisation order."""
        return list(self._meta)

    def __iter__(self):
        return iter(list(self._meta))

    def __contains__(self, key: Any) -> bool:
        return key in self._meta

    def __repr__(self) -> str:
        return f"<labkv.KVStore type={self._type!r} keys={len(self._meta)} id={self._id}>"

    # -- checks ------------------------------------------------------------
    def _check_key_kinds(self, keys: Sequence[Key]) -> None:
        kind = self._key_kind
        for key in keys:
            if kind is None:
                kind = type(key)
            elif type(key) is not kind:
                raise TypeError(
                    f"this store uses {_kind_name(kind)} keys; got {type(key).__name__} key "
                    f"{key!r} (one store takes one kind of key)"
                )

    def _check_known(self, keys: Sequence[Key]) -> None:
        self._check_key_kinds(keys)
        for key in keys:
            if key not in self._meta:
                raise KeyError(f"key {key!r} is not initialised; call init({key!r}, value) first")

    def _check_arrays(self, key: Key, arrays: Sequence[Any], what: str) -> None:
        shape, dtype = self._meta[key]
        for array in arrays:
            if array.shape != shape:
                raise ValueError(
                    f"{what} for key {key!r} has shape {tuple(array.shape)}, "
                    f"but the stored value has shape {shape}"
                )
            if array.dtype.kind == "c" and dtype.kind != "c":
                raise TypeError(f"{what} for key {key!r} is complex; the stored dtype is {dtype}")

    def _check_writable(self, key: Key, outs: Sequence[Any]) -> None:
        for out in outs:
            if isinstance(out, np.ndarray) and not out.flags.writeable:
                raise ValueError(f"out for key {key!r} is read-only")

    def _prepare(self, key: Any, value: Any, what: str) -> tuple[list[Key], bool, list[list]]:
        keys, single = normalize_keys(key)
        arrays = group(keys, single, value, what)
        self._check_known(keys)
        for k, arrs in zip(keys, arrays, strict=True):
            self._check_arrays(k, arrs, what)
        return keys, single, arrays

    # -- init ----------------------------------------------------------------
    def init(self, key: Key | Sequence[Key], value: Any) -> None:
        """Initialise one key or a list of keys with a value each.

        A list of per-device arrays for one key is accepted; its first array
        is used (the others must have the same shape). The store keeps its own
        copy: changing ``value`` afterwards does not change the store.

        >>> import labkv, numpy as np
        >>> kv = labkv.create()
        >>> kv.init(["a", "b"], [np.zeros(2), np.ones(3)])
        >>> kv.pull("b")
        array([1., 1., 1.])
        """
        keys, single = normalize_keys(key)
        arrays = group(keys, single, value, "value")
        self._check_key_kinds(keys)
        seen: set[Key] = set()
        for k, arrs in zip(keys, arrays, strict=True):
            if k in self._meta:
                raise ValueError(f"key {k!r} is already initialised")
            if k in seen:
                raise ValueError(f"key {k!r} appears twice in one init call")
            seen.add(k)
            if any(a.shape != arrs[0].shape for a in arrs):
                raise ValueError(f"the values given to init key {k!r} differ in shape")
        if not keys:
            return  # an empty list: nothing to do, as in MXNet
        items = [(k, arrs[0]) for k, arrs in zip(keys, arrays, strict=True)]
        self._init_impl(items)
        for k, array in items:
            self._meta[k] = (tuple(array.shape), np.dtype(array.dtype))
        if self._key_kind is None:
            self._key_kind = type(keys[0])
        if self.events.active:
            for k, array in items:
                self.events.emit("init", k, array, rank=self.rank)

    # -- push ----------------------------------------------------------------
    def push(self, key: Key | Sequence[Key], value: Any, priority: int = 0) -> None:
        """Push values: per key, the per-device arrays are summed, then the
        updater (default: store the sum) runs once.

        A key repeated in one call is summed into one update.

        >>> import labkv, numpy as np
        >>> kv = labkv.create()
        >>> kv.init(3, np.zeros(2))
        >>> kv.push([3, 3], [np.ones(2), [np.ones(2), np.ones(2)]])
        >>> kv.pull(3)
        array([3., 3.])
        """
        keys, _, arrays = self._prepare(key, value, "value")
        if keys:  # an empty list of keys does nothing, as in MXNet
            self._push_items(merge_repeated(keys, arrays))

    def _push_items(self, items: Items) -> None:
        start = time.time() if self.events.active else 0.0  # the start of its span in a trace
        commit = None
        sent = items
        if self._compression is not None:
            for k, _ in items:
                self._compression.check(k, self._meta[k][1])
            sent, commit = self._compression.compress(items)
        self._push_impl(sent)
        if commit is not None:
            self._residuals_committed(commit())
        events = self.events
        if events.active:
            quick = events.quick_push
            for k, values in items:
                try:  # free in Python 3.11+ while nothing raises; a key's first call does
                    if len(values) == 1 and next(quick[k], False):
                        continue  # counted: a credit of EventBus.quick spent
                except KeyError:
                    pass
                nbytes = self._nbytes(k) * len(values)
                admitted = events.admit("push", k, nbytes, self.rank, None, len(values))
                if admitted:
                    self._emit_push(k, values, *admitted, start)
            if self._deferred_events:
                self._flush_events()

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

    # -- pull ----------------------------------------------------------------
    def pull(
        self,
        key: Key | Sequence[Key],
        out: Any = None,
        priority: int = 0,
        ignore_sparse: bool = True,
    ) -> Any:
        """Copy the stored values into ``out`` (each array on its own device).

        With ``out=None`` new arrays are returned (an array for one key, a
        list for a list of keys); otherwise nothing is returned.

        >>> import labkv, numpy as np
        >>> kv = labkv.create()
        >>> kv.init(7, np.full(2, 5.0))
        >>> outs = [np.zeros(2), np.zeros(2)]
        >>> kv.pull(7, out=outs)
        >>> outs[1]
        array([5., 5.])
        """
        keys, single = normalize_keys(key)
        if out is None:
            self._check_known(keys)
            fresh = [self._new_out(k) for k in keys]
            if keys:
                self._pull_items(list(zip(keys, [[a] for a in fresh], strict=True)))
            return fresh[0] if single else fresh
        keys, _, outs = self._prepare(key, out, "out")
        for k, arrs in zip(keys, outs, strict=True):
            self._check_writable(k, arrs)
        if keys:
            self._pull_items(list(zip(keys, outs, strict=True)))
        return None

    def _pull_items(self, items: Items) -> None:
        start = time.time() if self.events.active else 0.0
        self._pull_impl(items)
        events = self.events
        if events.active:
            quick = events.quick_pull
            for k, outs in items:
                try:  # see _push_items
                    if len(outs) == 1 and next(quick[k], False):
                        continue  # counted: a credit of EventBus.quick spent
                except KeyError:
                    pass
                nbytes = self._nbytes(k) * len(outs)
                rank = self.rank
                admitted = events.admit("pull", k, nbytes, rank, None, len(outs))
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

    def pushpull(
        self, key: Key | Sequence[Key], value: Any, out: Any = None, priority: int = 0
    ) -> None:
        """Push ``value``, then pull into ``out`` (into ``value`` itself when ``out`` is None).

        >>> import labkv, numpy as np
        >>> kv = labkv.create()
        >>> kv.init(1, np.zeros(2))
        >>> grads = [np.ones(2), np.ones(2)]
        >>> kv.pushpull(1, grads)
        >>> grads[0]
        array([2., 2.])
        """
        keys, single, arrays = self._prepare(key, value, "value")
        target = value if out is None else out
        _, _, outs = self._prepare(key, target, "out")
        for k, arrs in zip(keys, outs, strict=True):
            self._check_writable(k, arrs)
        if keys:
            self._push_items(merge_repeated(keys, arrays))
            self._pull_items(list(zip(keys, outs, strict=True)))

    def broadcast(self, key: Key | Sequence[Key], value: Any, out: Any, priority: int = 0) -> None:
        """Initialise ``key`` with ``value`` and pull it into ``out`` (MXNet's broadcast).

        >>> import labkv, numpy as np
        >>> kv = labkv.create()
        >>> outs = [np.zeros(2), np.zeros(2)]
        >>> kv.broadcast("w", np.ones(2), out=outs)
        >>> outs[1]
        array([1., 1.])
        """
        keys, single = normalize_keys(key)
        outs = group(keys, single, out, "out")
        values = group(keys, single, value, "value")
        for k, v_arrs, o_arrs in zip(keys, values, outs, strict=True):
            for o in o_arrs:
                if o.shape != v_arrs[0].shape:
                    raise ValueError(
                        f"out for key {k!r} has shape {tuple(o.shape)}, "
                        f"but the value has shape {tuple(v_arrs[0].shape)}"
                    )
            self._check_writable(k, o_arrs)
        self.init(key, value)
        if keys:
            self._pull_items(list(zip(keys, outs, strict=True)))

    def row_sparse_pull(
        self, key: Key | Sequence[Key], out: Any = None, row_ids: Any = None, priority: int = 0
    ) -> Any:
        """Pull only the rows ``row_ids`` of each value; the other rows of
        ``out`` are set to zero (a dense picture of MXNet's row-sparse result).

        ``row_ids`` is an array of row numbers (one for all outs of a key, or
        one per out; for a list of keys, a list of those): ints, or floats
        holding whole numbers, as MXNet's default float32 ``nd.array`` makes.

        >>> import labkv, numpy as np
        >>> kv = labkv.create()
        >>> kv.init(0, np.arange(6.0).reshape(3, 2))
        >>> kv.row_sparse_pull(0, out=np.empty((3, 2)), row_ids=np.array([2]))
        >>> kv.row_sparse_pull(0, row_ids=np.array([2]))
        array([[0., 0.],
               [0., 0.],
               [4., 5.]])
        """
        if row_ids is None:
            raise TypeError("row_sparse_pull needs row_ids")
        keys, single = normalize_keys(key)
        self._check_known(keys)
        returned = out is None
        if returned:
            out_lists = [[self._new_out(k)] for k in keys]
        else:
            keys, _, out_lists = self._prepare(key, out, "out")
        id_lists = self._row_id_lists(keys, single, out_lists, row_ids)
        for k, outs in zip(keys, out_lists, strict=True):
            self._check_writable(k, outs)
        full = [self._new_out(k) for k in keys]
        if keys:
            self._pull_items([(k, [f]) for k, f in zip(keys, full, strict=True)])
        for f, outs, ids in zip(full, out_lists, id_lists, strict=True):
            for o, rows in zip(outs, ids, strict=True):
                copy_into(o, f)
                others = np.ones(o.shape[0], dtype=bool)
                others[rows] = False
                o[array_module(o).asarray(others)] = 0
        if returned:
            fresh = [o[0] for o in out_lists]
            return fresh[0] if single else fresh
        return None

    def _row_id_lists(
        self, keys: list[Key], single: bool, out_lists: list[list], row_ids: Any
    ) -> list[list]:
        per_key = [row_ids] if single else row_ids
        if not single and (not isinstance(row_ids, (list, tuple)) or len(row_ids) != len(keys)):
            raise LengthMismatchError(f"{len(keys)} keys need a list of {len(keys)} row_ids")
        result = []
        for k, outs, ids in zip(keys, out_lists, per_key, strict=True):
            shape = self._meta[k][0]
            if not shape:
                raise ValueError(f"row_sparse_pull needs a value with rows; key {k!r} is a scalar")
            id_arrays = ids if isinstance(ids, (list, tuple)) else [ids] * len(outs)
            if len(id_arrays) != len(outs):
                raise LengthMismatchError(
                    f"key {k!r}: {len(outs)} outs but {len(id_arrays)} row_ids"
                )
            result.append([_row_indices(k, rows, shape[0]) for rows in id_arrays])
        return result

    # -- updaters and optimizers -------------------------------------------
    def set_updater(self, updater: Callable[[Key, Any, Any], Any]) -> None:
        """Use ``updater(key, merged, stored)`` for every push; it changes
        ``stored`` in place. Called once per key per push, after aggregation,
        with the key as the user gave it. If it raises, the exception reaches
        the caller and no key of that push changes.

        >>> import labkv, numpy as np
        >>> kv = labkv.create()
        >>> kv.init(3, np.ones(2))
        >>> def update(key, merged, stored):
        ...     stored += merged * 2
        >>> kv.set_updater(update)
        >>> kv.push(3, np.ones(2))
        >>> kv.pull(3)
        array([3., 3.])
        """
        if not callable(updater):
            raise TypeError(f"updater must be callable, got {type(updater).__name__}")
        self._set_updater_impl(updater)
        self._updater, self._optimizer = updater, None

    _set_updater = set_updater

    def set_optimizer(self, optimizer: Optimizer | str, **params: Any) -> None:
        """Run ``optimizer`` on the store: pushes are gradients, the stored
        values are the weights. ``optimizer`` is a :mod:`labkv.optimizers`
        object or its name (then ``params`` are its hyper-parameters).

        >>> import labkv, numpy as np
        >>> kv = labkv.create()
        >>> kv.init(0, np.zeros(2, dtype=np.float32))
        >>> kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.5))
        >>> kv.push(0, [np.ones(2, dtype=np.float32)] * 2)
        >>> kv.pull(0)
        array([-1., -1.], dtype=float32)
        """
        if isinstance(optimizer, str):
            optimizer = create_optimizer(optimizer, **params)
        elif params:
            raise TypeError("params are only taken with an optimizer name")
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"expected a labkv optimizer, got {type(optimizer).__name__}")
        self._set_optimizer_impl(optimizer)
        self._optimizer, self._updater = optimizer, None

    def save_optimizer_states(self, fname: str | os.PathLike, dump_optimizer: bool = False) -> None:
        """Save the optimizer's per-key states (and with ``dump_optimizer``
        its settings) to ``fname`` as npz + JSON; loading never runs code.

        >>> import labkv, numpy as np, tempfile, os
        >>> kv = labkv.create()
        >>> kv.init(0, np.zeros(2, dtype=np.float32))
        >>> kv.set_optimizer("sgd", learning_rate=0.1, momentum=0.9)
        >>> kv.push(0, np.ones(2, dtype=np.float32))
        >>> path = os.path.join(tempfile.mkdtemp(), "states")
        >>> kv.save_optimizer_states(path)
        >>> kv.load_optimizer_states(path)
        """
        if self._optimizer is None:
            raise RuntimeError("no optimizer is set: call set_optimizer first")
        num_update, counts, states = self._optimizer_states()
        meta: dict[str, Any] = {
            "keys": [],
            "optimizer": self._optimizer.to_config() if dump_optimizer else None,
            "num_update": num_update,
        }
        arrays = {}
        for i, (k, state) in enumerate(states.items()):
            meta["keys"].append(
                {
                    "key": _statefile.encode_key(k),
                    "count": counts.get(k, 0),
                    "n": len(state),
                }
            )
            for j, array in enumerate(state):
                arrays[f"s{i}_{j}"] = array
        for k, count in counts.items():
            if k not in states:
                meta["keys"].append({"key": _statefile.encode_key(k), "count": count, "n": None})
        _statefile.save(fname, meta, arrays)

    def load_optimizer_states(self, fname: str | os.PathLike) -> None:
        """Load states saved by :meth:`save_optimizer_states`. If the file
        holds the optimizer's settings, that optimizer is set first.
        The file is checked whole before anything changes."""
        meta, arrays = _statefile.load(fname)
        optimizer = (
            Optimizer.from_config(meta["optimizer"]) if meta.get("optimizer") else self._optimizer
        )
        if optimizer is None:
            raise RuntimeError("no optimizer is set and the file holds none: set_optimizer first")
        counts: dict[Key, int] = {}
        states: dict[Key, tuple] = {}
        for i, entry in enumerate(meta["keys"]):
            k = _statefile.decode_key(entry["key"])
            if k not in self._meta:
                raise KeyError(f"the state file has key {k!r}, which this store does not have")
            counts[k] = int(entry["count"])
            if entry["n"] is not None:
                state = tuple(arrays[f"s{i}_{j}"] for j in range(entry["n"]))
                shape = self._meta[k][0]
                for array in state:
                    if array.shape != shape:
                        raise ValueError(
                            f"state for key {k!r} has shape {array.shape}, the value has {shape}"
                        )
                states[k] = state
        if optimizer is not self._optimizer:
            self.set_optimizer(optimizer)
        self._load_optimizer_states(int(meta["num_update"]), counts, states)

    def set_gradient_compression(self, compression_params: dict[str, Any]) -> None:
        """Compress pushed gradients: ``{'type': '2bit', 'threshold': 0.5}``
        (or ``'1bit'``; ``'none'`` turns it off). Each device keeps a residual
        per key; only float32 values can be compressed.

        >>> import labkv, numpy as np
        >>> kv = labkv.create("device")
        >>> kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
        >>> kv.init(0, np.zeros(3, dtype=np.float32))
        >>> kv.push(0, np.array([0.7, -0.2, -0.6], dtype=np.float32))
        >>> kv.pull(0)
        array([ 0.5,  0. , -0.5], dtype=float32)
        """
        compression = GradientCompression.from_params(compression_params)
        self._compression = compression if compression.type != "none" else None

    # -- what backends implement -------------------------------------------
    def _init_impl(self, items: list[tuple[Key, Any]]) -> None:
        raise NotImplementedError

    def _push_impl(self, items: Items) -> None:
        raise NotImplementedError

    def _pull_impl(self, items: Items) -> None:
        raise NotImplementedError

    def _new_out(self, key: Key) -> Any:
        raise NotImplementedError

    def _set_updater_impl(self, updater: Callable) -> None:
        raise NotImplementedError

    def _set_optimizer_impl(self, optimizer: Optimizer) -> None:
        raise NotImplementedError

    def _optimizer_states(self) -> tuple[int, dict, dict]:
        """``(num_update, per-key update counts, per-key states)``: the global
        count stays apart, so any key name (even ``'__num_update__'``) is safe."""
        raise NotImplementedError

    def _load_optimizer_states(self, num_update: int, counts: dict, states: dict) -> None:
        raise NotImplementedError

    def _barrier_impl(self) -> None:
        raise NotImplementedError

    def _residuals_committed(self, replaced: dict) -> None:
        """A push's compression residuals were committed, replacing ``replaced``
        (a backend whose push can still fail later keeps them to restore)."""
        return None

    #: events a backend held back during a push (a list it fills; never filled here)
    _deferred_events: Sequence[Any] = ()

    def _flush_events(self) -> None:
        """Report the events in :attr:`_deferred_events` (after the push's own)."""
        return None


__all__ = ["KVStore", "LengthMismatchError", "normalize_key"]
