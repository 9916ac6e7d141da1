"""Reduction of per-device values, and the choice of each key's home GPU.

(Broadcasting a value to many outputs is ``copy_into`` per output, in the stores' pulls.)

``sum_into(dst, values)`` writes ``values[0] + values[1] + ...`` into the
existing array ``dst``, adding in place, left to right (MXNet's order, so
float32 sums are bit-identical), with no temporaries when everything is on
the CPU. CuPy values are summed on ``dst``'s GPU after a peer copy; numpy
destinations take CuPy values through host copies.

>>> import numpy as np
>>> dst = np.empty(3, dtype=np.float32)
>>> sum_into(dst, [np.ones(3), np.full(3, 2.0), np.full(3, 3.0)])
>>> dst
array([6., 6., 6.], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .devices import Device, copy_into, is_cupy

__all__ = ["sum_into", "HomeDevices"]


def _sum_into_numpy(dst: np.ndarray, values: Sequence[Any]) -> None:
    values = [v.get() if is_cupy(v) else v for v in values]
    np.add(values[0], values[1], out=dst, casting="unsafe")
    for value in values[2:]:
        np.add(dst, value, out=dst, casting="unsafe")


def _sum_into_cupy(dst: Any, values: Sequence[Any]) -> None:
    import cupy

    with cupy.cuda.Device(dst.device.id):
        # Values on other GPUs (or the host) are gathered onto dst's GPU first;
        # cupy.asarray does the peer copy. Values already there are used as is.
        local = [
            v if is_cupy(v) and v.device.id == dst.device.id else cupy.asarray(v) for v in values
        ]
        cupy.add(local[0], local[1], out=dst, casting="unsafe")
        for value in local[2:]:
            cupy.add(dst, value, out=dst, casting="unsafe")


def sum_into(dst: Any, values: Sequence[Any]) -> None:
    """``dst[...] = sum(values)``, cast to ``dst.dtype``, computed where ``dst`` lives.

    >>> out = np.zeros(2)
    >>> sum_into(out, [np.ones(2)])
    >>> out
    array([1., 1.])
    """
    if not values:
        raise ValueError("sum_into needs at least one value")
    if len(values) == 1:
        copy_into(dst, values[0])
    elif is_cupy(dst):
        _sum_into_cupy(dst, values)
    else:
        _sum_into_numpy(dst, values)


class HomeDevices:
    """Chooses a home GPU for each key so that bytes are balanced across GPUs.

    MXNet's device store reduces each key on one GPU and spreads keys so every
    GPU holds about the same number of bytes; this is the same greedy rule:
    a new key goes to the least loaded of the GPUs that push it.

    >>> homes = HomeDevices()
    >>> gpus = [Device("gpu", 0), Device("gpu", 1)]
    >>> homes.assign("a", 100, gpus), homes.assign("b", 10, gpus), homes.assign("c", 10, gpus)
    (gpu(0), gpu(1), gpu(1))
    """

    def __init__(self) -> None:
        self.home: dict[Any, Device] = {}
        self.load: dict[Device, int] = {}

    def assign(self, key: Any, nbytes: int, candidates: Sequence[Device]) -> Device:
        """The key's home, choosing one among ``candidates`` the first time."""
        if key in self.home:
            return self.home[key]
        best = min(sorted(set(candidates)), key=lambda d: self.load.get(d, 0))
        self.home[key] = best
        self.load[best] = self.load.get(best, 0) + nbytes
        return best
