"""Normalisation of the ``key`` / ``value`` / ``out`` arguments of store calls.

MXNet accepts a key or a list of keys, and for each key an array or a list of
per-device arrays. Everything here turns that into ``[(key, [arrays])]`` and
raises a clear error for anything else, before the store changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._types import Key
from ..devices import as_array
from ..sparse import RowSparseArray


class LengthMismatchError(ValueError, TypeError):
    """Keys, values and outs of one call do not line up.

    It is both a ``ValueError`` and a ``TypeError``: the arguments have the
    wrong structure, whichever way the caller chose to look at it.
    """


def normalize_key(key: Any) -> Key:
    """A key as the store keeps it: a Python ``int`` or ``str``.

    numpy integers count as ints; ``bool``, floats, ``None`` and bytes are refused.
    """
    if type(key) is int or type(key) is str:
        return key
    if isinstance(key, (bool, np.bool_)):
        raise TypeError(f"keys must be int or str, got bool {key!r}")
    if isinstance(key, (int, np.integer)):
        return int(key)
    if isinstance(key, str):
        return str(key)
    raise TypeError(f"keys must be int or str, got {type(key).__name__} {key!r}")


def normalize_keys(key: Any) -> tuple[list[Key], bool]:
    """``(keys, single)``: the list of keys of a call and whether one key was given.

    An empty list is a call about no keys (as in MXNet, it does nothing)."""
    if isinstance(key, (list, tuple)):
        return [normalize_key(k) for k in key], False
    return [normalize_key(key)], True


def _one_array(value: Any, key: Key, what: str, position: int | None) -> Any:
    if isinstance(value, RowSparseArray):
        return value
    try:
        array = as_array(value)
    except TypeError:
        where = f"{what} for key {key!r}" + ("" if position is None else f" (device {position})")
        raise TypeError(
            f"{where} must be an array (numpy, CuPy, or convertible), got {type(value).__name__}"
        ) from None
    if array.dtype.kind not in "biufc":
        raise TypeError(f"{what} for key {key!r} has non-numeric dtype {array.dtype}")
    return array


def arrays_for_key(value: Any, key: Key, what: str) -> list[Any]:
    """One key's value as a list of per-device arrays."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise LengthMismatchError(f"{what} for key {key!r} is an empty list")
        return [_one_array(v, key, what, i) for i, v in enumerate(value)]
    return [_one_array(value, key, what, None)]


def group(keys: list[Key], single: bool, value: Any, what: str) -> list[list[Any]]:
    """Per key, the list of arrays given for it in ``value`` (or ``out``)."""
    if single:
        return [arrays_for_key(value, keys[0], what)]
    if not isinstance(value, (list, tuple)):
        raise LengthMismatchError(
            f"{len(keys)} keys need a list of {len(keys)} {what}s, got {type(value).__name__}"
        )
    if len(value) != len(keys):
        raise LengthMismatchError(f"{len(keys)} keys but {len(value)} {what}s")
    return [arrays_for_key(v, k, what) for k, v in zip(keys, value, strict=True)]


def merge_repeated(keys: Sequence[Key], arrays: Sequence[list[Any]]) -> list[tuple[Key, list]]:
    """Join the arrays of a key that appears several times in one call, in order."""
    merged: dict[Key, list[Any]] = {}
    for key, values in zip(keys, arrays, strict=True):
        merged.setdefault(key, []).extend(values)
    return list(merged.items())
