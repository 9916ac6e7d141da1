"""Filling the outs of ``row_sparse_pull`` from the rows a store read.

A backend reads each key's rows once (the union of what its outs ask for, sorted);
:func:`sliced_rows` picks one out's rows from that block and :func:`fill_out`
writes them on the out's own device: a row-sparse out becomes exactly those
rows, a dense out gets them with its other rows zeroed.

>>> import numpy as np
>>> out = np.full((3, 2), 9.0)
>>> fill_out(out, *sliced_rows(np.ones((2, 2)), np.array([0, 2]), np.array([2])))
>>> out
array([[0., 0.],
       [0., 0.],
       [1., 1.]])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..devices import device_of, on_device, to_device
from . import RowSparseArray
from ._row_ops import cast, put_rows, take_rows


def sliced_rows(block: Any, rows: np.ndarray, out_rows: np.ndarray) -> tuple[Any, np.ndarray]:
    """``(data, out_rows)``: the rows ``out_rows`` (a sorted subset of ``rows``) of
    ``block``, which holds the rows ``rows``."""
    if len(out_rows) == len(rows):
        return block, out_rows
    return take_rows(block, np.searchsorted(rows, out_rows)), out_rows


def fill_out(out: Any, data: Any, rows: np.ndarray) -> None:
    """Write ``data`` (the rows ``rows`` of a value) into ``out`` (see module doc)."""
    device = device_of(out)
    if isinstance(out, RowSparseArray):
        moved = to_device(data, device)
        if moved.dtype != out.dtype:
            moved = cast(moved, out.dtype)
        out._assign(moved, rows.copy())
        return
    with on_device(device):
        out.fill(0)
    put_rows(out, rows, data)
