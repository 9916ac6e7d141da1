"""The ``row_ids`` of ``row_sparse_pull``: checked and turned into int64 row numbers.

>>> import numpy as np
>>> row_indices("w", np.array([2.0, 0.0], np.float32), num_rows=3)
array([2, 0])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._call.args import LengthMismatchError
from .._types import Key
from ..devices import is_cupy


def row_indices(key: Key, row_ids: Any, num_rows: int) -> np.ndarray:
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


def row_id_lists(
    shapes: list[tuple[int, ...]],
    keys: list[Key],
    single: bool,
    out_lists: list[list],
    row_ids: Any,
) -> list[list[np.ndarray]]:
    """Per key (of shape ``shapes[i]``), per out: the rows to pull. ``row_ids`` is
    one array for all outs of a key or one per out; for a list of keys, a list
    of those."""
    per_key = [row_ids] if single else row_ids
    if not single and (not isinstance(row_ids, (list, tuple)) or len(row_ids) != len(keys)):
        raise LengthMismatchError(f"{len(keys)} keys need a list of {len(keys)} row_ids")
    result = []
    for shape, k, outs, ids in zip(shapes, keys, out_lists, per_key, strict=True):
        if not shape:
            raise ValueError(f"row_sparse_pull needs a value with rows; key {k!r} is a scalar")
        id_arrays = ids if isinstance(ids, (list, tuple)) else [ids] * len(outs)
        if len(id_arrays) != len(outs):
            raise LengthMismatchError(f"key {k!r}: {len(outs)} outs but {len(id_arrays)} row_ids")
        result.append([row_indices(k, rows, shape[0]) for rows in id_arrays])
    return result
