"""Row operations of row-sparse values, each on the device of the array it changes.

Row numbers are host int64 arrays (index arithmetic is cheap and stays on the host);
data stays where it lives. CuPy makes arrays and runs kernels on the *current* GPU,
so every operation here makes the device of the array it writes (or reads) current
and brings the index there first: an index array made on another GPU would be an
operand from another device (the bug ``row_sparse_pull`` once had).

>>> import numpy as np
>>> dst = np.zeros((3, 2), np.float32)
>>> put_rows(dst, np.array([2]), np.ones((1, 2)))
>>> take_rows(dst, np.array([0, 2]))
array([[0., 0.],
       [1., 1.]], dtype=float32)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..devices import Device, device_of, empty, is_cupy, on_device, to_device


def zeros_on(shape: tuple[int, ...], dtype: Any, device: Device) -> Any:
    """Zeros of ``shape`` on ``device``."""
    array = empty(shape, dtype, device)
    with on_device(device):
        array.fill(0)
    return array


def arange_rows(num_rows: int) -> np.ndarray:
    """Every row number of a value of ``num_rows`` rows (host int64)."""
    return np.arange(num_rows, dtype=np.int64)


def _index(array: Any, rows: np.ndarray) -> Any:
    """``rows`` as an index for ``array``, on its device (call with that device current)."""
    if is_cupy(array):
        import cupy

        return cupy.asarray(rows)
    return rows


def take_rows(data: Any, rows: np.ndarray) -> Any:
    """A new array of ``data``'s rows ``rows``, on ``data``'s device."""
    with on_device(device_of(data)):
        return data[_index(data, rows)]


def put_rows(dst: Any, rows: np.ndarray, src: Any) -> None:
    """``dst[rows] = src`` (cast to ``dst``'s dtype), ``src`` brought to ``dst``'s device."""
    if len(rows) == 0:
        return
    device = device_of(dst)
    with on_device(device):
        dst[_index(dst, rows)] = to_device(src, device, copy=False)


def add_rows(dst: Any, rows: np.ndarray, src: Any) -> None:
    """``dst[rows] += src`` for unique ``rows``, ``src`` brought to ``dst``'s device."""
    if len(rows) == 0:
        return
    device = device_of(dst)
    with on_device(device):
        index = _index(dst, rows)
        dst[index] = dst[index] + to_device(src, device, copy=False)


def union(index_arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The sorted union of sorted unique int64 row arrays.

    >>> union([np.array([0, 3]), np.array([1, 3])])
    array([0, 1, 3])
    """
    if len(index_arrays) == 1:
        return index_arrays[0]
    return functools.reduce(np.union1d, index_arrays).astype(np.int64, copy=False)


def gather(data: Any, indices: np.ndarray, rows: np.ndarray, device: Device, dtype: Any) -> Any:
    """The rows ``rows`` of a row-sparse value (``data`` holding rows ``indices``) as a
    dense block on ``device``: zeros where the value holds no such row."""
    if len(indices) == len(rows) and np.array_equal(indices, rows):
        picked = to_device(data, device)
        return picked if picked.dtype == dtype else cast(picked, dtype)
    out = zeros_on((len(rows), *data.shape[1:]), dtype, device)
    if len(indices) == 0 or len(rows) == 0:
        return out
    where = np.searchsorted(indices, rows)
    clipped = np.minimum(where, len(indices) - 1)
    present = (where < len(indices)) & (indices[clipped] == rows)
    if present.any():
        put_rows(out, np.flatnonzero(present), take_rows(data, clipped[present]))
    return out


def cast(array: Any, dtype: Any) -> Any:
    """``array`` in ``dtype`` (a new array), on its device."""
    with on_device(device_of(array)):
        return array.astype(dtype)


def nonzero_rows(dense: Any) -> np.ndarray:
    """The rows of ``dense`` holding a non-zero, as host int64 (one bool per row
    comes to the host, not the data)."""
    if dense.size == 0:
        return np.zeros(0, np.int64)
    with on_device(device_of(dense)):
        mask = (dense != 0).reshape(dense.shape[0], -1).any(axis=1)
        host = mask.get() if is_cupy(mask) else np.asarray(mask)
    return np.flatnonzero(host).astype(np.int64)
