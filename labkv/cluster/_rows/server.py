"""The server's side of row-sparse messages: the rows a push carries as a
:class:`~labkv.sparse.RowSparseArray` of the stored piece, and the rows a pull asks for.

A push's ``rows`` (``PushHeader.rows``) give, per key, the row numbers within the
server's piece of the data that travels in the key's slot; a pull's ``rows``
(``Pull.rows``) ask, per key, for rows of the piece (a 1-D array of row numbers) or,
for a dense key sliced by elements, for element spans (an ``(n, 2)`` array of
``[start, stop)`` offsets within the flat piece).

>>> import numpy as np
>>> stored = {"e": (np.dtype("f4"), (3, 2))}
>>> spec = row_lookup(stored.get, {"e": np.array([2])})
>>> spec("e")
(dtype('float32'), (1, 2))
>>> [(k, v.indices, v.shape) for k, v in with_rows([("e", np.ones((1, 2)))], {"e": np.array([2])}, stored.get)]
[('e', array([2]), (3, 2))]
>>> piece = np.arange(6.0).reshape(3, 2)
>>> read_rows([piece], ["e"], {"e": np.array([0, 2])}, {"e": (3, 2)})[0].tolist()
[[0.0, 1.0], [4.0, 5.0]]
>>> read_rows([piece.ravel()], ["e"], {"e": np.array([[1, 3]])}, {"e": (6,)})[0].tolist()
[1.0, 2.0]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...sparse import RowSparseArray
from ...sparse._row_ops import take_rows

Lookup = Callable[[Any], tuple[Any, tuple[int, ...]]]


def row_lookup(lookup: Lookup, rows: dict) -> Lookup:
    """``lookup`` (a key's stored ``(dtype, piece shape)``) with the shape of the rows
    that travel for the keys of ``rows``."""

    def spec(key: Any) -> tuple[Any, tuple[int, ...]]:
        dtype, shape = lookup(key)
        if key in rows:
            return dtype, (len(rows[key]), *shape[1:])
        return dtype, shape

    return spec


def with_rows(items: list[tuple[Any, Any]], rows: dict, lookup: Lookup) -> list[tuple[Any, Any]]:
    """A push's ``(key, value)``, the values of the keys of ``rows`` as row-sparse
    arrays of the stored piece's shape."""
    return [
        (k, RowSparseArray(v, np.asarray(rows[k], np.int64), lookup(k)[1]) if k in rows else v)
        for k, v in items
    ]


def span_index(spans: np.ndarray) -> np.ndarray:
    """The element offsets of ``[start, stop)`` spans, in order.

    >>> span_index(np.array([[0, 2], [5, 6]])).tolist()
    [0, 1, 5]
    """
    lengths = spans[:, 1] - spans[:, 0]
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    firsts = np.repeat(spans[:, 0] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return firsts + np.arange(total, dtype=np.int64)


def read_rows(values: list[Any], keys: list[Any], rows: dict | None, shapes: dict) -> list[Any]:
    """``values`` (the stored pieces of ``keys``), those of the keys a pull's ``rows``
    name cut to the rows (or spans) asked for; ``shapes``: each key's whole shape."""
    if not rows:
        return values
    out = []
    for key, value in zip(keys, values, strict=True):
        want = rows.get(key)
        if want is None:
            out.append(value)
        elif want.ndim == 1:
            out.append(take_rows(value.reshape(-1, *tuple(shapes[key])[1:]), want))
        else:
            out.append(take_rows(value.reshape(-1), span_index(want)))
    return out


def request_nbytes(rows: dict | None) -> int:
    """The bytes of a pull's row numbers (counted in the server's ``bytes_in``)."""
    return sum(int(r.nbytes) for r in rows.values()) if rows else 0
