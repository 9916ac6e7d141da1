"""The rules for row-sparse values in store calls, checked before anything changes.

- a key initialised with a :class:`~labkv.sparse.RowSparseArray` takes row-sparse
  gradients only (MXNet stores a dense push there as a dense value, and the next
  ``row_sparse_pull`` fails); a dense key takes either;
- gradient compression refuses row-sparse pushes, with MXNet's message;
- a ``pull`` into a row-sparse out writes nothing with ``ignore_sparse=True`` and
  warns, as MXNet 1.9.1 does.

>>> import labkv, labkv.sparse as sparse
>>> g = sparse.zeros("row_sparse", (3, 2))
>>> check_push("w", True, [g], None)
>>> check_push("w", True, [labkv.zeros((3, 2))], None)
Traceback (most recent call last):
...
TypeError: key 'w' holds a row_sparse value: push row_sparse gradients (labkv.sparse.cast_storage(g, 'row_sparse'))
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from .._types import Key
from . import RowSparseArray

#: MXNet 1.9.1's message (kvstore_dist.h) for a compressed row-sparse push.
COMPRESSION_REFUSED = "Gradient compression for row sparse storage type is not supported"
#: MXNet 1.9.1's warning (kvstore_local.h) for a pull into a row-sparse out.
PULL_IGNORED = (
    "non-default weights detected during kvstore pull. This call has been ignored. "
    "Please make sure to use kv.row_sparse_pull() or module.prepare() with row_ids."
)


def check_push(key: Key, sparse_key: bool, values: Sequence[Any], compression: Any) -> None:
    """Refuse a push of ``values`` to ``key`` that breaks a rule of the module doc."""
    kinds = {isinstance(v, RowSparseArray) for v in values}
    if len(kinds) > 1:
        raise TypeError(f"the values pushed to key {key!r} mix row_sparse and dense arrays")
    if sparse_key and False in kinds:
        raise TypeError(
            f"key {key!r} holds a row_sparse value: push row_sparse gradients "
            "(labkv.sparse.cast_storage(g, 'row_sparse'))"
        )
    if True in kinds and compression is not None:
        raise ValueError(f"{COMPRESSION_REFUSED} (key {key!r})")


def dense_outs(outs: list[Any], ignore_sparse: bool) -> list[Any]:
    """The outs a ``pull`` writes: with ``ignore_sparse``, row-sparse outs are left
    as they are, with MXNet's warning."""
    if not ignore_sparse or not any(isinstance(o, RowSparseArray) for o in outs):
        return outs
    warnings.warn(PULL_IGNORED, UserWarning, stacklevel=3)
    return [o for o in outs if not isinstance(o, RowSparseArray)]
