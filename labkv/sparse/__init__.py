"""Row-sparse arrays, with the names of MXNet's ``mx.nd.sparse`` (``row_sparse`` storage).

A :class:`RowSparseArray` of shape ``(rows, ...)`` holds only some of its rows:
``data`` (numpy or CuPy, one row per index, on the array's device) and ``indices``
(a host int64 array, sorted and unique); every other row is zero. Stores take them
as values and gradients (``init``, ``push``, ``row_sparse_pull``): a push of an
embedding's gradient then moves the rows it touches, not the table.

>>> import labkv.sparse as sparse, numpy as np
>>> a = sparse.row_sparse_array((np.ones((2, 3)), [1, 4]), shape=(5, 3))
>>> a
<RowSparseArray 5x3 @cpu(0)>
>>> a.indices, a.stype
(array([1, 4]), 'row_sparse')
>>> a.tostype("default")[:2]
array([[0., 0., 0.],
       [1., 1., 1.]])
>>> sparse.cast_storage(np.eye(3, dtype=np.float32), "row_sparse").indices
array([0, 1, 2])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..devices import Device, as_array, cpu, device_of, is_cupy, on_device, to_device
from . import _row_ops as ops

__all__ = ["RowSparseArray", "cast_storage", "is_row_sparse", "retain", "row_sparse_array", "zeros"]

STYPES = ("default", "row_sparse")


class RowSparseArray:
    """Rows ``indices`` of an array of ``shape`` (see module doc); make one with
    :func:`row_sparse_array`, :func:`zeros` or :func:`cast_storage`."""

    stype = "row_sparse"
    __slots__ = ("_data", "_indices", "_shape")

    def __init__(self, data: Any, indices: np.ndarray, shape: tuple[int, ...]):
        # Trusted: the constructors below check their input first.
        self._data, self._indices, self._shape = data, indices, tuple(shape)

    data = property(lambda self: self._data, doc="The rows held, one per index (numpy or CuPy).")
    indices = property(lambda self: self._indices, doc="The rows' numbers: host int64, sorted.")
    shape = property(lambda self: self._shape, doc="The shape of the whole (dense) array.")
    dtype = property(lambda self: self._data.dtype)
    ndim = property(lambda self: len(self._shape))
    size = property(lambda self: int(np.prod(self._shape, dtype=np.int64)))
    nbytes = property(
        lambda self: int(self._data.nbytes) + int(self._indices.nbytes),
        doc="Bytes of the rows held and their indices (what moving it costs).",
    )
    device = property(lambda self: device_of(self._data), doc="Where ``data`` lives.")
    context = device  # MXNet's name

    def __repr__(self) -> str:
        return f"<RowSparseArray {'x'.join(map(str, self._shape))} @{self.device}>"

    def tostype(self, stype: str) -> Any:
        """``'default'``: a dense array on the same device; ``'row_sparse'``: a copy."""
        return cast_storage(self, stype)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """The dense value, for numpy (host data only, as CuPy refuses an implicit
        copy): an MXNet updater's ``local += recv`` of a row-sparse ``recv`` adds it.

        >>> w = np.ones((3, 1), np.float32)
        >>> w += row_sparse_array(([[2.0]], [1]), shape=(3, 1))
        >>> w.ravel().tolist()
        [1.0, 3.0, 1.0]
        """
        if is_cupy(self._data):
            raise TypeError(
                "a RowSparseArray on a GPU is not converted to numpy implicitly: "
                "use .asnumpy() or .tostype('default')"
            )
        if copy is False:
            raise ValueError("a RowSparseArray's dense value is always a new array")
        dense = self.tostype("default")
        return dense if dtype is None else dense.astype(dtype, copy=False)

    def asnumpy(self) -> np.ndarray:
        """The dense value as a host numpy array."""
        dense = self.tostype("default")
        return dense.get() if is_cupy(dense) else np.asarray(dense)

    def copy(self) -> RowSparseArray:
        """A copy on the same device."""
        return self.to_device(self.device)

    def to_device(self, device: Device, copy: bool = True) -> RowSparseArray:
        """This array with its data on ``device`` (a copy unless ``copy=False``
        and it is there already)."""
        if not copy and self.device == device:
            return self
        return RowSparseArray(to_device(self._data, device), self._indices.copy(), self._shape)

    as_in_context = to_device  # MXNet's name

    def copyto(self, other: RowSparseArray | Device) -> RowSparseArray:
        """Copy into ``other`` (a row-sparse array of the same shape, changed in
        place, its data kept on its device) or onto a device; returns the copy."""
        if isinstance(other, Device):
            return self.to_device(other)
        other[:] = self
        return other

    def retain(self, indices: Any) -> RowSparseArray:
        """The rows among ``indices`` that this array holds (see :func:`retain`)."""
        return retain(self, indices)

    def _assign(self, data: Any, indices: np.ndarray) -> None:
        self._data, self._indices = data, indices

    def __setitem__(self, key: Any, value: Any) -> None:
        """``a[:] = b``: ``b`` (row-sparse or dense, of ``a``'s shape) becomes ``a``'s
        value, kept on ``a``'s device in ``a``'s dtype."""
        if not (isinstance(key, slice) and key == slice(None)):
            raise TypeError("a RowSparseArray is assigned whole only: a[:] = value")
        source = value if isinstance(value, RowSparseArray) else cast_storage(value, "row_sparse")
        if source.shape != self._shape:
            raise ValueError(f"cannot assign shape {source.shape} to a row-sparse {self._shape}")
        data = to_device(source.data, self.device)
        if data.dtype != self.dtype:
            data = ops.cast(data, self.dtype)
        self._assign(data, source.indices.copy())

    # -- arithmetic as MXNet's sparse operators: row-sparse with row-sparse stays sparse
    def __add__(self, other: Any) -> Any:
        if isinstance(other, RowSparseArray):
            return add(self, other)
        return self.tostype("default") + other

    __radd__ = __add__

    def __sub__(self, other: Any) -> Any:
        return self + (-other)

    def __rsub__(self, other: Any) -> Any:
        return (-self) + other

    def __neg__(self) -> RowSparseArray:
        return self._scaled(-1)

    def __mul__(self, scalar: Any) -> RowSparseArray:
        if not np.isscalar(scalar):
            raise TypeError("a RowSparseArray is multiplied by scalars only")
        return self._scaled(scalar)

    __rmul__ = __mul__

    def __truediv__(self, scalar: Any) -> RowSparseArray:
        return self * (1.0 / scalar)

    def __iadd__(self, other: Any) -> RowSparseArray:
        self[:] = self + other
        return self

    def __isub__(self, other: Any) -> RowSparseArray:
        self[:] = self - other
        return self

    def _scaled(self, scalar: Any) -> RowSparseArray:
        with on_device(self.device):
            data = self._data * self.dtype.type(scalar)
        return RowSparseArray(data, self._indices.copy(), self._shape)


def is_row_sparse(value: Any) -> bool:
    """Whether ``value`` is a :class:`RowSparseArray`.

    >>> is_row_sparse(zeros("row_sparse", (2, 2))), is_row_sparse(np.zeros(2))
    (True, False)
    """
    return isinstance(value, RowSparseArray)


def _check_indices(indices: Any, num_rows: int) -> np.ndarray:
    rows = np.asarray(indices.get() if is_cupy(indices) else indices)
    if rows.ndim != 1:
        raise ValueError(f"indices must be 1-D, got shape {rows.shape}")
    if rows.size and rows.dtype.kind not in "iuf":
        raise TypeError(f"indices must be integers, got {rows.dtype}")
    if rows.dtype.kind == "f" and not np.all(np.isfinite(rows) & (rows == np.round(rows))):
        raise ValueError("indices must be whole numbers")
    rows = rows.astype(np.int64)
    if rows.size and (rows[0] < 0 or rows[-1] >= num_rows or rows.min() < 0):
        bad = rows[(rows < 0) | (rows >= num_rows)][0]
        raise IndexError(f"index {bad} out of range for {num_rows} rows")
    if np.any(np.diff(rows) <= 0):
        raise ValueError("indices must be sorted and unique (strictly increasing)")
    return rows


def row_sparse_array(
    arg1: Any,
    shape: Sequence[int] | None = None,
    dtype: Any = None,
    device: Device | None = None,
    ctx: Device | None = None,
) -> RowSparseArray:
    """A :class:`RowSparseArray` from ``(data, indices)``, from another one (copied),
    or from a dense array (its non-zero rows), as ``mx.nd.sparse.row_sparse_array``.

    ``shape`` defaults to ``(max(indices) + 1, *data.shape[1:])``; ``dtype`` to
    ``data``'s (float32 for lists); ``device`` (MXNet: ``ctx``) to ``data``'s.
    Indices must be sorted, unique and in range; ``data`` must hold one row per
    index with the trailing shape of ``shape``.

    >>> row_sparse_array(([[1, 2]], [3]), shape=(4, 2)).asnumpy()[3]
    array([1., 2.], dtype=float32)
    >>> row_sparse_array((np.ones((1, 2)), [0, 1]), shape=(4, 2))
    Traceback (most recent call last):
    ...
    ValueError: data has 1 rows for 2 indices
    """
    device = device or ctx
    if isinstance(arg1, RowSparseArray):
        source = arg1
    elif isinstance(arg1, tuple) and len(arg1) == 2:
        source = _from_parts(*arg1, shape)
    else:
        source = cast_storage(as_array(arg1), "row_sparse")
    if shape is not None and tuple(shape) != source.shape:
        raise ValueError(f"shape {tuple(shape)} does not fit a value of shape {source.shape}")
    data = to_device(source.data, device or source.device)
    if dtype is not None and data.dtype != np.dtype(dtype):
        data = ops.cast(data, np.dtype(dtype))
    return RowSparseArray(data, source.indices.copy(), source.shape)


def _from_parts(data: Any, indices: Any, shape: Sequence[int] | None) -> RowSparseArray:
    if not hasattr(data, "dtype"):  # a list: float32, as MXNet
        data = np.asarray(data, dtype=np.float32)
    data = as_array(data)
    if data.dtype.kind not in "biuf":
        raise TypeError(f"data must be numeric, got {data.dtype}")
    if data.ndim < 1:
        raise ValueError("data must have one row per index (at least 1-D)")
    host_rows = np.asarray(indices.get() if is_cupy(indices) else indices)
    if shape is None:
        shape = (int(host_rows.max()) + 1 if host_rows.size else 0, *data.shape[1:])
    shape = tuple(int(s) for s in shape)
    if not shape:
        raise ValueError("a row-sparse array needs a shape with rows (at least 1-D)")
    rows = _check_indices(host_rows, shape[0])
    if data.shape[0] != len(rows):
        raise ValueError(f"data has {data.shape[0]} rows for {len(rows)} indices")
    if tuple(data.shape[1:]) != shape[1:]:
        raise ValueError(
            f"data rows have shape {tuple(data.shape[1:])}; shape {shape} needs {shape[1:]}"
        )
    return RowSparseArray(data, rows, shape)


def zeros(
    stype: str,
    shape: int | Sequence[int],
    device: Device | None = None,
    dtype: Any = "float32",
    ctx: Device | None = None,
) -> Any:
    """An all-zero array of storage ``stype``: ``'row_sparse'`` holds no rows;
    ``'default'`` is a dense array (as ``mx.nd.sparse.zeros``).

    >>> z = zeros("row_sparse", (3, 2))
    >>> z.data.shape, z.indices
    ((0, 2), array([], dtype=int64))
    """
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    device = device or ctx or cpu(0)
    if stype == "default":
        return ops.zeros_on(shape, np.dtype(dtype), device)
    _check_stype(stype)
    if not shape:
        raise ValueError("a row-sparse array needs a shape with rows (at least 1-D)")
    data = ops.zeros_on((0, *shape[1:]), np.dtype(dtype), device)
    return RowSparseArray(data, np.zeros(0, np.int64), shape)


def _check_stype(stype: str) -> None:
    if stype not in STYPES:
        raise ValueError(f"unknown storage type {stype!r}; labkv has {list(STYPES)}")


def cast_storage(array: Any, stype: str) -> Any:
    """``array`` as storage ``stype`` (a new array on its device): a dense array's
    ``'row_sparse'`` form holds its non-zero rows; a row-sparse array's
    ``'default'`` form is dense.

    >>> cast_storage(np.array([[0.0, 0.0], [1.0, 0.0]]), "row_sparse").indices
    array([1])
    """
    _check_stype(stype)
    if isinstance(array, RowSparseArray):
        if stype == "row_sparse":
            return array.copy()
        dense = ops.zeros_on(array.shape, array.dtype, array.device)
        ops.put_rows(dense, array.indices, array.data)
        return dense
    array = as_array(array)
    if stype == "default":
        with on_device(device_of(array)):
            return array.copy()
    if array.ndim < 1:
        raise ValueError("a row-sparse array needs a value with rows (at least 1-D)")
    rows = ops.nonzero_rows(array)
    return RowSparseArray(ops.take_rows(array, rows), rows, tuple(array.shape))


def retain(array: RowSparseArray, indices: Any) -> RowSparseArray:
    """The rows of ``array`` whose numbers are in ``indices`` (the others dropped),
    as ``mx.nd.sparse.retain``.

    >>> a = row_sparse_array((np.arange(4.0).reshape(2, 2), [0, 3]), shape=(4, 2))
    >>> retain(a, [3, 1]).indices
    array([3])
    """
    if not isinstance(array, RowSparseArray):
        raise TypeError(f"retain takes a RowSparseArray, got {type(array).__name__}")
    wanted = np.asarray(indices.get() if is_cupy(indices) else indices).reshape(-1)
    keep = np.isin(array.indices, wanted.astype(np.int64))
    positions = np.flatnonzero(keep)
    data = ops.take_rows(array.data, positions)
    return RowSparseArray(data, array.indices[positions], array.shape)


def add(a: RowSparseArray, b: RowSparseArray) -> RowSparseArray:
    """``a + b``, row-sparse, on ``a``'s device in ``a``'s dtype (MXNet's ``elemwise_add``)."""
    if a.shape != b.shape:
        raise ValueError(f"cannot add row-sparse arrays of shapes {a.shape} and {b.shape}")
    return sum_rows([a, b], a.dtype, a.device)


def sum_rows(values: Sequence[RowSparseArray], dtype: Any, device: Device) -> RowSparseArray:
    """The sum of row-sparse ``values`` of one shape: rows of the union of theirs,
    summed left to right (MXNet's order) on ``device`` in ``dtype``."""
    rows = ops.union([v.indices for v in values])
    shape = values[0].shape
    if len(values) == 1:
        return RowSparseArray(ops.gather(values[0].data, rows, rows, device, dtype), rows, shape)
    data = ops.zeros_on((len(rows), *shape[1:]), dtype, device)
    for value in values:
        ops.add_rows(data, np.searchsorted(rows, value.indices), value.data)
    return RowSparseArray(data, rows.copy(), shape)
