"""Value summaries an event carries: ``min``, ``max``, ``mean`` and L2 ``norm``.

>>> import numpy as np
>>> summarize(np.array([3.0, -4.0]))
{'min': -4.0, 'max': 3.0, 'mean': -0.5, 'norm': 5.0}
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..devices import array_module, device_of, is_cupy, on_device, to_device

__all__ = ["summarize", "summarize_sum"]


def summarize(array: Any) -> dict[str, float]:
    """``min``, ``max``, ``mean`` and L2 ``norm`` of an array, as Python floats,
    computed on the array's own device (whichever GPU is current in the caller).

    >>> summarize(np.array([3.0, -4.0]))
    {'min': -4.0, 'max': 3.0, 'mean': -0.5, 'norm': 5.0}
    """
    if getattr(array, "stype", None) == "row_sparse":  # the rows it holds
        array = array.data
    if array.size == 0:
        return {"min": math.nan, "max": math.nan, "mean": math.nan, "norm": 0.0}
    # CuPy runs kernels on the *current* GPU and refuses operands that live on another:
    # callers (a shard's events, the monitor's thread, a server) may have any one current.
    with on_device(device_of(array)):
        return _summarize_here(array)


def _summarize_here(array: Any) -> dict[str, float]:
    xp = array_module(array)
    flat = array.reshape(-1)
    if flat.dtype.kind == "c":
        flat = xp.abs(flat)
    elif flat.dtype.kind != "f":
        flat = flat.astype(np.float64)
    # Min/max in the array's own dtype, the mean accumulated in float64 and the norm
    # from one dot product: no float64 copy of a float32 array (this runs per event).
    # A float16 dot product overflows from a norm of 256 on: its squares add in float32.
    squares = flat.astype(np.float32) if flat.dtype.itemsize < 4 else flat
    if xp is np:
        return {
            "min": float(flat.min()),
            "max": float(flat.max()),
            "mean": float(flat.mean(dtype=np.float64)),
            "norm": math.sqrt(float(np.vdot(squares, squares).real)),
        }
    # On a GPU: the four stats come to the host in one copy.
    stats = xp.stack(
        [
            flat.min().astype(np.float64),
            flat.max().astype(np.float64),
            flat.mean(dtype=np.float64),
            xp.sqrt(xp.vdot(squares, squares).real.astype(np.float64)),
        ]
    )
    stats = stats.get() if is_cupy(stats) else stats
    return dict(zip(("min", "max", "mean", "norm"), (float(s) for s in stats), strict=True))


def summarize_sum(values: Sequence[Any]) -> dict[str, float]:
    """:func:`summarize` of ``values[0] + values[1] + ...`` (arrays of one shape on
    any devices), added in float64 on the first one's device.

    >>> summarize_sum([np.ones(2, np.float32), np.full(2, 2.0)])
    {'min': 3.0, 'max': 3.0, 'mean': 3.0, 'norm': 4.242640687119285}
    """
    device = device_of(values[0])
    with on_device(device):
        total = values[0].astype(np.float64)
        for value in values[1:]:
            total += to_device(value, device, copy=False)
    return summarize(total)
