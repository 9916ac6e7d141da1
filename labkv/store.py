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

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._call.args import (
    LengthMismatchError,
    group,
    merge_repeated,
    normalize_key,
    normalize_keys,
)
from ._call.reporting import Reporting
from ._call.updating import Updating
from ._call.validate import Checks
from ._types import DIST_KINDS, Key
from .compression import GradientCompression
from .devices import device_of
from .events import EventBus
from .optimizers import Optimizer
from .shard import check_new_keys
from .sparse import RowSparseArray
from .sparse._fill_outs import fill_out, sliced_rows
from .sparse._push_rules import check_push, dense_outs
from .sparse._row_ids import row_id_lists
from .sparse._row_ops import gather, take_rows

Items = list[tuple[Key, list[Any]]]


class KVStore(Checks, Updating, Reporting):
    """A key-value store for parameters and gradients, with MXNet's API.

    Use :func:`labkv.create` to make one. Keys are ``int`` or ``str`` (one
    kind per store); values are numpy or CuPy arrays, one per device, summed
    on push. Every failing call raises before it changes anything.
    """

    def __init__(self, kvtype: str, name: str | None = None):
        self._kind = kvtype  # the labkv store type: what the backend does
        self._type = name or kvtype  # the name the user gave (MXNet's kv.type)
        self._id = f"{kvtype}-{uuid.uuid4().hex[:8]}"
        self.events = EventBus(self._id, read=self._stored)
        self._meta: dict[Key, tuple[tuple[int, ...], np.dtype]] = {}
        self._sizes: dict[Key, int] = {}
        self._sparse: set[Key] = set()  # the keys holding a row-sparse value
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

    def _repr_html_(self) -> str:
        """A notebook's view: type (rank, servers and replicas on a cluster), each
        key's shape, dtype, placement and bytes, and the bytes per server or device."""
        from ._store_reprs import store_html

        return store_html(self)

    # -- init ----------------------------------------------------------------
    def init(self, key: Key | Sequence[Key], value: Any) -> None:
        """Initialise one key or a list of keys with a value each.

        A list of per-device arrays for one key is accepted; its first array
        is used (the others must have the same shape). The store keeps its own
        copy: changing ``value`` afterwards does not change the store.

        On a local store the key is there when ``init`` returns. On a
        ``dist_*`` store the owner (rank 0 of a run, or the notebook that
        shares its store) initialises the key on the servers; another rank's
        ``init`` waits until the owner's is done, checks that the shapes and
        dtypes agree, and its values are not used: its pushes are applied to
        the owner's value. MXNet: rank 0 pushes the values, every worker's
        init ends in a barrier.

        >>> import labkv, numpy as np
        >>> kv = labkv.create()
        >>> kv.init(["a", "b"], [np.zeros(2), np.ones(3)])
        >>> kv.pull("b")
        array([1., 1., 1.])
        """
        keys, single = normalize_keys(key)
        arrays = group(keys, single, value, "value")
        self._check_key_kinds(keys)
        check_new_keys(keys, self._meta)
        for k, arrs in zip(keys, arrays, strict=True):
            if any(a.shape != arrs[0].shape for a in arrs):
                raise ValueError(f"the values given to init key {k!r} differ in shape")
        if not keys:
            return  # an empty list: nothing to do, as in MXNet
        items = [(k, arrs[0]) for k, arrs in zip(keys, arrays, strict=True)]
        self._init_impl(items)
        for k, array in items:
            self._meta[k] = (tuple(array.shape), np.dtype(array.dtype))
            if isinstance(array, RowSparseArray):
                self._sparse.add(k)
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
        for k, values in items:
            check_push(k, k in self._sparse, values, self._compression)
        if self._compression is not None:
            for k, _ in items:
                self._compression.check(k, self._meta[k][1])
            # A dist store's pushes travel packed: it gets each device's codes.
            sent, commit = self._compression.compress(items, packed=self._kind in DIST_KINDS)
        self._push_impl(sent)
        if commit is not None:
            self._residuals_committed(commit())
        if self.events.active:
            self._report_push(items, start)

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
        list for a list of keys); otherwise nothing is returned. A row-sparse
        key is written into a dense ``out`` whole; a row-sparse ``out`` is
        left as it is with ``ignore_sparse=True`` (with MXNet's warning: use
        :meth:`row_sparse_pull`), and gets the whole value with ``False``.

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
                self._pull_items(list(zip(keys, [[a] for a in fresh], strict=True)), False)
            return fresh[0] if single else fresh
        keys, _, outs = self._prepare(key, out, "out")
        for k, arrs in zip(keys, outs, strict=True):
            self._check_writable(k, arrs)
        if keys:
            self._pull_items(list(zip(keys, outs, strict=True)), ignore_sparse)
        return None

    def _pull_items(self, items: Items, ignore_sparse: bool = True) -> None:
        start = time.time() if self.events.active else 0.0
        if ignore_sparse and any(type(o) is RowSparseArray for _, outs in items for o in outs):
            items = [(k, dense_outs(outs, True)) for k, outs in items]
            items = [(k, outs) for k, outs in items if outs]
        self._pull_impl(items)
        if self.events.active:
            self._report_pull(items, start)

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
        """Pull only the rows ``row_ids`` of each value.

        A :class:`~labkv.sparse.RowSparseArray` ``out`` gets exactly those rows,
        unique and sorted (as MXNet), on its own device; a dense ``out`` gets them
        with its other rows set to zero. Only the rows asked for are read. With
        ``out=None`` new outs are returned: row-sparse for a row-sparse key, dense
        for a dense one.

        ``row_ids`` is an array of row numbers (one for all outs of a key, or
        one per out; for a list of keys, a list of those): ints, or floats
        holding whole numbers, as MXNet's default float32 ``nd.array`` makes.

        >>> import labkv, numpy as np
        >>> kv = labkv.create()
        >>> kv.init(0, np.arange(6.0).reshape(3, 2))
        >>> kv.row_sparse_pull(0, row_ids=np.array([2]))
        array([[0., 0.],
               [0., 0.],
               [4., 5.]])
        >>> rows = labkv.sparse.zeros("row_sparse", (3, 2), dtype="float64")
        >>> kv.row_sparse_pull(0, out=rows, row_ids=np.array([2, 0, 2]))
        >>> rows.indices, rows.data
        (array([0, 2]), array([[0., 1.],
               [4., 5.]]))
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
        shapes = [self._meta[k][0] for k in keys]
        id_lists = row_id_lists(shapes, keys, single, out_lists, row_ids)
        for k, outs in zip(keys, out_lists, strict=True):
            self._check_writable(k, outs)
        wanted = [np.unique(np.concatenate(ids)) for ids in id_lists]
        if keys:
            blocks = self._pull_rows(list(zip(keys, wanted, strict=True)))
            for block, rows, outs, ids in zip(blocks, wanted, out_lists, id_lists, strict=True):
                for o, out_rows in zip(outs, ids, strict=True):
                    fill_out(o, *sliced_rows(block, rows, np.unique(out_rows)))
        if returned:
            fresh = [o[0] for o in out_lists]
            return fresh[0] if single else fresh
        return None

    def _pull_rows(self, items: list[tuple[Key, np.ndarray]]) -> list[Any]:
        """Per ``(key, rows)``: the rows ``rows`` (sorted, unique) of the value, an
        array of ``len(rows)`` rows on any device. This default pulls whole values
        (and reports those pulls); a backend that can read rows alone overrides it."""
        full = [self._new_out(k) for k, _ in items]
        self._pull_items([(k, [f]) for (k, _), f in zip(items, full, strict=True)], False)
        return [
            gather(f.data, f.indices, rows, device_of(f), f.dtype)
            if isinstance(f, RowSparseArray)
            else take_rows(f, rows)
            for f, (_, rows) in zip(full, items, strict=True)
        ]

    # -- reading without a pull ------------------------------------------------------
    def peek(self, key: Key) -> Any:
        """A copy of ``key``'s value as the store holds it now, read without a pull:
        no event, nothing counted, no waiting for a ``dist_sync`` round, and safe
        to call from another thread (a monitor's refresh). On a cluster store it
        may be a round behind what a pull after a push returns.

        >>> import labkv, numpy as np
        >>> kv = labkv.create()
        >>> kv.init(0, np.ones(2))
        >>> kv.peek(0)
        array([1., 1.])
        """
        raise NotImplementedError

    def placement(self) -> dict[Key, list[dict[str, Any]]]:
        """Where every key lives: per key, a list of its pieces, each ``{'server':
        s or None, 'device': str, 'start': a, 'stop': b}`` (flat element offsets).
        A store in this process holds every key in one piece (``server`` None); a
        cluster store cuts big values into contiguous slices on several servers.

        >>> import labkv, numpy as np
        >>> kv = labkv.create()
        >>> kv.init(0, np.zeros(4))
        >>> kv.placement()
        {0: [{'server': None, 'device': 'cpu(0)', 'start': 0, 'stop': 4}]}
        """
        raise NotImplementedError

    # -- what backends implement -------------------------------------------
    def _init_impl(self, items: list[tuple[Key, Any]]) -> None:
        raise NotImplementedError

    def _push_impl(self, items: Items) -> None:
        raise NotImplementedError

    def _pull_impl(self, items: Items) -> None:
        raise NotImplementedError

    def _new_out(self, key: Key) -> Any:
        raise NotImplementedError

    def _barrier_impl(self) -> None:
        raise NotImplementedError


__all__ = ["KVStore", "LengthMismatchError", "normalize_key"]
