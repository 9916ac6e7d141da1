"""A rank's side of row-sparse keys: init pieces, pushes cut by servers' rows, and
``row_sparse_pull`` asking each server only for the rows it holds.

>>> import labkv.sparse as sparse
>>> from .row_placement import place_rows
>>> g = sparse.row_sparse_array((np.ones((2, 1)), [0, 3]), shape=(4, 1))
>>> [(s, p.indices.tolist(), p.shape) for s, p in row_pieces([g], ((4, 1), g.dtype), place_rows((4, 1), 2), "e", True)]
[(0, [0], (2, 1)), (1, [1], (2, 1))]
>>> requests(np.array([1, 3]), place_rows((4, 1), 2), (4, 1))
[(0, array([1])), (1, array([1]))]
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any

import numpy as np

from ...devices import cpu
from ...sparse import RowSparseArray, is_row_sparse, sum_rows
from ...sparse import zeros as sparse_zeros
from .._device import host_view
from .._placement import Piece
from .._protocol.messages import decode_values, values_items
from .row_placement import row_ranges

__all__ = [
    "init_pieces",
    "kept_rows",
    "new_out",
    "pull_rows",
    "requests",
    "row_pieces",
    "rows_of_batch",
    "same_rows",
]


def new_out(shape: tuple, dtype: Any, sparse: bool) -> Any:
    """A fresh out for a pull of a key: row-sparse (no rows) for a row-sparse key."""
    return sparse_zeros("row_sparse", shape, dtype=dtype) if sparse else np.empty(shape, dtype)


def _host(data: Any) -> np.ndarray:
    return np.ascontiguousarray(host_view(data))


def init_pieces(array: Any, placed: list[Piece]) -> list[tuple[int, np.ndarray]] | None:
    """``(server, dense piece of rows)`` of a row-sparse init value (None for a dense
    one): each server's rows, the rows the value does not hold zero."""
    if not is_row_sparse(array):
        return None
    shape, rows, data = array.shape, array.indices, _host(array.data)
    out = []
    for server, lo, hi in row_ranges(placed, shape):
        piece = np.zeros((hi - lo, *shape[1:]), array.dtype)
        a, b = np.searchsorted(rows, [lo, hi])
        piece[rows[a:b] - lo] = data[a:b]
        out.append((server, piece))
    return out


def row_pieces(
    values: list[RowSparseArray], meta: tuple, placed: list[Piece], key: Any, sparse: bool
) -> list[tuple[int, RowSparseArray]]:
    """``(server, rows)`` of a row-sparse push of one key (its devices' values summed
    here first, by the union of their rows, in the stored dtype ``meta[1]``): every
    server of the key gets its rows (none, maybe: a dist_sync round waits for every
    rank's push), numbered within its range, as a fresh host array; ``sparse``: the
    key is row-sparse (a dense key takes row-sparse pushes only when whole)."""
    shape, dtype = meta
    ranges = row_ranges(placed, shape) if sparse or len(placed) == 1 else None
    if ranges is None:  # a dense key's pieces are flat: its rows cannot be updated alone
        raise ValueError(
            f"key {key!r} is dense and sliced over the servers by elements: push dense "
            "gradients to it, or initialise it with a row_sparse value"
        )
    if len(values) == 1:
        total = values[0]
    else:
        total = sum_rows([v.to_device(cpu(0), copy=False) for v in values], dtype, cpu(0))
    rows, data = total.indices, _host(total.data)
    out = []
    for server, lo, hi in ranges:
        a, b = np.searchsorted(rows, [lo, hi])
        piece = RowSparseArray(np.array(data[a:b]), rows[a:b] - lo, (hi - lo, *shape[1:]))
        out.append((server, piece))
    return out


def kept_rows(value: RowSparseArray) -> RowSparseArray:
    """A host copy of a row-sparse push value (its rows and their data), kept after
    the push timed out: the next push, if it is the same (:func:`same_rows`), is its
    retry and is not sent again (``DistStore._push_impl``)."""
    return RowSparseArray(np.array(host_view(value.data)), value.indices.copy(), value.shape)


def same_rows(kept: Any, value: Any) -> bool:
    """Whether ``value`` is the row-sparse value ``kept``: both row-sparse, of one
    shape and dtype, with the same rows holding the same bits.

    >>> g = RowSparseArray(np.ones((1, 2), np.float32), np.array([3]), (5, 2))
    >>> kept = kept_rows(g)
    >>> same_rows(kept, g), same_rows(kept, RowSparseArray(g.data, np.array([4]), (5, 2)))
    (True, False)
    >>> g.data[0, 0] = 2.0  # changed in place since: a new push
    >>> same_rows(kept, g), same_rows(kept, g.tostype("default"))
    (False, False)
    """
    if not (is_row_sparse(kept) and is_row_sparse(value)):
        return False
    if kept.shape != value.shape or not np.array_equal(kept.indices, value.indices):
        return False
    data = host_view(value.data)
    return (
        data.dtype == kept.dtype
        and data.shape == kept.data.shape
        and np.array_equal(data, kept.data)
    )


def rows_of_batch(batch: list[tuple[Any, Any]]) -> tuple[list[tuple[Any, Any]], dict | None]:
    """A push batch with each row-sparse value's data in its place, and the rows
    that travel with them (``PushHeader.rows``; None when the batch has none)."""
    rows = {k: v.indices for k, v in batch if is_row_sparse(v)}
    if not rows:
        return batch, None
    return [(k, v.data if k in rows else v) for k, v in batch], rows


def requests(wanted: np.ndarray, placed: list[Piece], shape: tuple) -> list[tuple[int, np.ndarray]]:
    """Per server holding some of the rows ``wanted`` (sorted, unique) of a value of
    ``shape`` placed as ``placed``: its row numbers within its piece, or, for a dense
    key sliced by elements, the ``[start, stop)`` element spans within its piece."""
    ranges = row_ranges(placed, shape)
    out = []
    if ranges is not None:
        for server, lo, hi in ranges:
            a, b = np.searchsorted(wanted, [lo, hi])
            if b > a:
                out.append((server, wanted[a:b] - lo))
        return out
    row = math.prod(shape[1:])
    starts, stops = wanted * row, (wanted + 1) * row
    for p in placed:
        spans = np.stack([np.maximum(starts, p.start), np.minimum(stops, p.stop)], axis=1)
        spans = spans[spans[:, 1] > spans[:, 0]]
        if len(spans):
            out.append((p.server, spans - p.start))
    return out


def pull_rows(
    calls: Any,
    meta: dict,
    pieces: dict,
    items: list[tuple[Any, np.ndarray]],
    rank: Any,
    step: Any,
    store: Any = None,
) -> list[np.ndarray]:
    """``DistStore._pull_rows``: per ``(key, rows)``, the rows (a host block of
    ``len(rows)`` rows), each server asked only for those it holds, in one pull per
    server (``calls``: the store's :class:`~labkv.cluster._rank.calls.Calls`);
    reported as one pull per key by ``store`` (its rows and bytes) while watched."""
    watched = store is not None and store.events.active
    start = time.time() if watched else 0.0
    blocks = _pull_blocks(calls, meta, pieces, items, rank, step)
    if watched:  # the bytes moved: the rows and their ids, as on a local store
        moved = [int(b.nbytes) + int(rows.nbytes) for b, (_, rows) in zip(blocks, items)]
        pulled = [(k, [b]) for (k, _), b in zip(items, blocks, strict=True)]
        store._report_pull(pulled, start, moved, [len(rows) for _, rows in items])
    return blocks


def _pull_blocks(
    calls: Any, meta: dict, pieces: dict, items: list[tuple[Any, np.ndarray]], rank: Any, step: Any
) -> list[np.ndarray]:
    asked: dict[int, dict] = defaultdict(dict)
    for key, wanted in items:
        for server, want in requests(wanted, pieces[key], meta[key][0]):
            asked[server][key] = want
    keys = {s: list(r) for s, r in asked.items()}
    got: dict[tuple[int, Any], np.ndarray] = {}
    if keys:
        replies = calls.pull(keys, rank, step, dict(asked))
        for (s, ks), reply in zip(keys.items(), replies, strict=True):

            def spec(key: Any, s: int = s) -> tuple[Any, tuple[int, ...]]:
                shape, dtype = meta[key]
                want = asked[s][key]
                if want.ndim == 1:
                    return dtype, (len(want), *shape[1:])
                return dtype, (int((want[:, 1] - want[:, 0]).sum()),)

            for key, value in values_items(ks, decode_values(reply), spec):
                got[(s, key)] = value
    blocks = []
    for key, wanted in items:
        shape, dtype = meta[key]
        parts = [got[(p.server, key)] for p in pieces[key] if (p.server, key) in got]
        flat = np.concatenate([np.ravel(x) for x in parts]) if parts else np.zeros(0, dtype)
        blocks.append(flat.astype(dtype, copy=False).reshape(len(wanted), *shape[1:]))
    return blocks
