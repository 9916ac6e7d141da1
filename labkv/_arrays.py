"""Array constructors that take a ``device``: ``ones``, ``zeros``, ``full``, ``array``."""

from __future__ import annotations

from typing import Any

import numpy as np

from .devices import Device, cpu, to_device

Shape = int | tuple[int, ...]


def array(data: Any, device: Device | None = None, dtype: Any = None) -> Any:
    """A new array holding ``data`` on ``device`` (default ``cpu(0)``).

    >>> array([1, 2], device=cpu(1), dtype="float32")
    array([1., 2.], device=cpu(1))
    """
    host = np.array(data, dtype=dtype)
    return to_device(host, device or cpu(0), copy=False)


def full(
    shape: Shape, fill_value: Any, device: Device | None = None, dtype: Any = "float32"
) -> Any:
    """An array of ``shape`` filled with ``fill_value`` on ``device`` (float32 by default, as MXNet).

    >>> full(2, 7.0)
    array([7., 7.], dtype=float32)
    """
    return to_device(np.full(shape, fill_value, dtype=dtype), device or cpu(0), copy=False)


def ones(shape: Shape, device: Device | None = None, dtype: Any = "float32") -> Any:
    """Ones on ``device`` (float32 by default).

    >>> ones((1, 2))
    array([[1., 1.]], dtype=float32)
    """
    return full(shape, 1, device, dtype)


def zeros(shape: Shape, device: Device | None = None, dtype: Any = "float32") -> Any:
    """Zeros on ``device`` (float32 by default).

    >>> zeros(2, device=cpu(2))
    array([0., 0.], device=cpu(2))
    """
    return full(shape, 0, device, dtype)
