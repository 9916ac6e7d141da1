"""Shrinking a key's value to something drawable (the value view's picture).

>>> import numpy as np
>>> downsample(np.arange(10.0), max_points=5)
array([0.5, 2.5, 4.5, 6.5, 8.5])
>>> downsample(np.ones((100, 3)), max_side=10).shape
(10, 3)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..devices import is_cupy

__all__ = ["as_plane", "downsample"]


def _bin_means(a: np.ndarray, axis: int, bins: int) -> np.ndarray:
    """Means of ``bins`` nearly equal contiguous blocks along ``axis`` (NaN-padded)."""
    n = a.shape[axis]
    if n <= bins:
        return a
    step = math.ceil(n / bins)
    bins = math.ceil(n / step)
    pad = bins * step - n
    if pad:
        widths = [(0, 0)] * a.ndim
        widths[axis] = (0, pad)
        a = np.pad(a, widths, constant_values=np.nan)
    shape = a.shape[:axis] + (bins, step) + a.shape[axis + 1 :]
    return np.nanmean(a.reshape(shape), axis=axis + 1)


def as_plane(value: Any) -> np.ndarray:
    """The value as float64 numpy: 1-D stays 1-D, 0-D becomes one point, N-D
    becomes 2-D (first axis by the rest)."""
    a = np.asarray(value.get() if is_cupy(value) else value, dtype=np.float64)
    if a.ndim == 0:
        return a.reshape(1)
    if a.ndim > 2:
        return a.reshape(a.shape[0], -1)
    return a


def downsample(value: Any, max_points: int = 1000, max_side: int = 96) -> np.ndarray:
    """A small float64 picture of ``value``: at most ``max_points`` bin means
    for 1-D, at most ``max_side`` x ``max_side`` block means for 2-D and up."""
    a = as_plane(value)
    if a.ndim == 1:
        return _bin_means(a, 0, max_points)
    return _bin_means(_bin_means(a, 0, max_side), 1, max_side)
