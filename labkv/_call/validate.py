"""Whole-call validation: the rules every call is checked against before anything
changes (key kinds, initialisation, shapes, complex values, writable outs).

:class:`Checks` is a part of :class:`labkv.store.KVStore`; it reads the store's
``_meta`` (``{key: (shape, dtype)}``) and ``_key_kind``.

>>> import labkv, numpy as np
>>> kv = labkv.create()
>>> kv.init(0, np.zeros(2))
>>> kv.push(0, np.zeros(3))
Traceback (most recent call last):
...
ValueError: value for key 0 has shape (3,), but the stored value has shape (2,)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._types import Key
from .args import group, normalize_keys


def _kind_name(kind: type) -> str:
    return kind.__name__


class Checks:
    """The checks of a store call (see module doc)."""

    _meta: dict[Key, tuple[tuple[int, ...], np.dtype]]
    _key_kind: type | None

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
