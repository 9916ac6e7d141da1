"""Many small arrays as ONE contiguous buffer per message.

Dask serialises every numpy array of a message as its own frame with its own
header: for 200 values of 1 KiB that per-array cost, not the bytes, is the
whole time of a push or pull. A rank therefore packs the small values it sends
to one server into one ``uint8`` buffer, and a server packs the small values
of a pull reply the same way. No layout travels with the buffer: both sides
know every key's dtype and (piece) shape, and compute the same offsets from
them with :func:`layout` (each value starts at a multiple of ``ALIGN`` bytes,
so that the views :func:`unpack` makes are aligned for any dtype).

>>> import numpy as np
>>> a, b = np.arange(3, dtype=np.float32), np.ones((2, 2), dtype=np.int8)
>>> buf = pack([a, b])
>>> buf.nbytes
20
>>> x, y = unpack(buf, [(a.dtype, a.shape), (b.dtype, b.shape)])
>>> x.tolist(), y.tolist()
([0.0, 1.0, 2.0], [[1, 1], [1, 1]])
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: Values smaller than this travel packed; bigger ones as their own frame
#: (without a copy, which is what matters for them).
PACK_BELOW = 1 << 16
ALIGN = 16

Spec = tuple[Any, tuple[int, ...]]  # (dtype, shape)


def _padded(nbytes: int) -> int:
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


def layout(nbytes: Sequence[int]) -> tuple[list[int], int]:
    """Offsets of values of ``nbytes`` bytes each, and the packed size.

    >>> layout([12, 4, 0, 1])
    ([0, 16, 32, 32], 33)
    """
    offsets, end = [], 0
    for n in nbytes:
        end = _padded(end)
        offsets.append(end)
        end += n
    return offsets, end


def pack(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The raw bytes of C-contiguous numpy ``arrays``, laid out by :func:`layout`."""
    if len(arrays) == 1:  # a tiny call's one value: its bytes, copied
        return arrays[0].reshape(-1).view(np.uint8).copy()
    offsets, total = layout([a.nbytes for a in arrays])
    buf = np.empty(total, dtype=np.uint8)
    for a, off in zip(arrays, offsets, strict=True):
        n = a.nbytes
        if n:
            buf[off : off + n] = a.reshape(-1).view(np.uint8)
    return buf


def unpack(buf: Any, specs: Sequence[Spec]) -> list[np.ndarray]:
    """Views of the arrays :func:`pack` put in ``buf``, given their ``(dtype, shape)``."""
    buf = np.frombuffer(buf, dtype=np.uint8)
    if len(specs) == 1:  # one value, at offset 0 (a wrong size raises below)
        ((d, shape),) = specs
        d = np.dtype(d)
        if buf.nbytes == d.itemsize * math.prod(shape):
            return [np.ndarray(shape, d, buffer=buf)]
    dtypes = [np.dtype(d) for d, _ in specs]
    offsets, total = layout(
        [d.itemsize * math.prod(shape) for d, (_, shape) in zip(dtypes, specs, strict=True)]
    )
    if buf.nbytes != total:
        raise ValueError(f"packed buffer has {buf.nbytes} bytes; its layout needs {total}")
    return [
        np.ndarray(shape, d, buffer=buf, offset=off)
        for d, off, (_, shape) in zip(dtypes, offsets, specs, strict=True)
    ]


def unpack_values(
    keys: Sequence[Any],
    big: Sequence[int],
    packed: Any,
    bigs: Sequence[Any],
    specs: Callable[[list[Any]], list[Spec]],
) -> list[tuple[Any, Any]]:
    """``(key, value)`` for each of a message's ``keys``, in order: the keys at
    positions ``big`` have their own arrays in ``bigs`` (in that order); the
    others' values are views into ``packed``, laid out by ``specs(their keys)``.

    >>> buf = pack([np.arange(2, dtype=np.int8)])
    >>> big = np.zeros(3)
    >>> got = unpack_values(["a", "b"], [1], buf, [big], lambda ks: [(np.int8, (2,))] * len(ks))
    >>> got[0][1].tolist(), got[1][1] is big
    ([0, 1], True)
    """
    if not big:
        small_keys = list(keys)
    else:
        big_set = set(big)
        small_keys = [k for i, k in enumerate(keys) if i not in big_set]
    small = iter(unpack(packed, specs(small_keys)) if small_keys else ())
    if not big:
        return list(zip(keys, small, strict=True))
    large = iter(bigs)
    return [(k, next(large) if i in big_set else next(small)) for i, k in enumerate(keys)]


def seal(msg: tuple) -> tuple | bytes:
    """A message with no big arrays (its last element, ``bigs``, holding no
    array, and a packed buffer under ``PACK_BELOW``) as one pickled ``bytes``:
    Dask then ships a single frame instead of serialising the tuple's elements
    one by one (16 vs 47 us per message here). Other messages stay tuples, so
    that each array goes as its own frame, without a copy. Pickle is what Dask
    itself uses for these objects. (A pull's last element is the sealed pushes
    it carries: ``bytes``, which pickle copies in one piece.)

    >>> unseal(seal((1, [2], []))) == (1, [2], [])
    True
    >>> isinstance(seal((1, [2], (b"push",))), bytes)
    True
    """
    if not sealable(msg):
        return msg
    return pickle.dumps(msg, protocol=5)


def sealable(msg: tuple) -> bool:
    """Whether :func:`seal` makes ``msg`` one ``bytes``."""
    last = msg[-1]  # bigs, or a pull's sealed pushes: mostly empty
    if last and not all(isinstance(x, bytes) for x in last):
        return False
    return not any(isinstance(x, np.ndarray) and x.nbytes >= PACK_BELOW for x in msg)


def unseal(msg: tuple | bytes) -> tuple:
    """The message :func:`seal` made (a tuple passes through)."""
    if isinstance(msg, bytes):
        return pickle.loads(msg)
    return msg
