"""Devices, where an array lives, and moving arrays between devices.

A :class:`Device` is ``cpu(i)`` or ``gpu(i)``. Numpy arrays live on ``cpu(0)``
unless they were made for a *simulated* CPU device (``cpu(1)``, ``cpu(2)``...),
which lets multi-device tutorials run on a laptop: such arrays are numpy
arrays of the :class:`DeviceArray` subclass that remember their device.
CuPy arrays live on ``gpu(array.device.id)``. CuPy is imported lazily, only
when a GPU array is met or asked for, so CPU machines never import it.

>>> import labkv
>>> a = labkv.ones((2, 3), device=labkv.cpu(1))
>>> labkv.device_of(a)
cpu(1)
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

__all__ = [
    "Device",
    "DeviceArray",
    "cpu",
    "gpu",
    "devices",
    "num_gpus",
    "device_of",
    "array_module",
    "is_cupy",
    "to_device",
    "copy_into",
    "as_array",
    "on_device",
    "empty",
    "empty_like",
    "new_like",
]


@dataclass(frozen=True, order=True)
class Device:
    """A compute device: ``kind`` is ``'cpu'`` or ``'gpu'``, ``id`` its ordinal.

    >>> Device("gpu", 1)
    gpu(1)
    """

    kind: str
    id: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("cpu", "gpu"):
            raise ValueError(f"device kind must be 'cpu' or 'gpu', got {self.kind!r}")
        if not isinstance(self.id, (int, np.integer)) or isinstance(self.id, bool) or self.id < 0:
            raise ValueError(f"device id must be a non-negative int, got {self.id!r}")

    def __repr__(self) -> str:
        return f"{self.kind}({self.id})"

    __str__ = __repr__


def cpu(device_id: int = 0) -> Device:
    """The CPU device ``device_id`` (ids above 0 are simulated devices).

    >>> cpu(2)
    cpu(2)
    """
    return Device("cpu", int(device_id))


def gpu(device_id: int = 0) -> Device:
    """The GPU device ``device_id`` (arrays on it are CuPy arrays).

    >>> gpu(0)
    gpu(0)
    """
    return Device("gpu", int(device_id))


@functools.lru_cache(maxsize=1)
def _cupy() -> ModuleType | None:
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        return cupy
    except Exception:  # no CuPy, no driver, no GPU: all mean "CPU only"
        return None


def num_gpus() -> int:
    """Number of CUDA GPUs usable through CuPy (0 when CuPy or a GPU is missing).

    >>> num_gpus() >= 0
    True
    """
    cp = _cupy()
    return 0 if cp is None else int(cp.cuda.runtime.getDeviceCount())


def devices(n: int) -> list[Device]:
    """``n`` devices for a multi-device run: GPUs when there are ``n`` of them,
    else ``n`` simulated CPU devices.

    >>> devices(2) if num_gpus() < 2 else [cpu(0), cpu(1)]
    [cpu(0), cpu(1)]
    """
    if n < 1:
        raise ValueError(f"need at least one device, got n={n}")
    kind = "gpu" if num_gpus() >= n else "cpu"
    return [Device(kind, i) for i in range(n)]


class DeviceArray(np.ndarray):
    """A numpy array that lives on a simulated CPU device ``cpu(i)``.

    Arithmetic on it keeps the device, so tutorial code reads like
    multi-GPU code.

    >>> a = to_device(np.zeros(2), cpu(3))
    >>> device_of(a * 2)
    cpu(3)
    """

    device_id: int = 0

    def __array_finalize__(self, obj: Any) -> None:
        self.device_id = getattr(obj, "device_id", 0)

    def __repr__(self) -> str:
        body = np.array2string(np.asarray(self), separator=", ", prefix="array(")
        return f"array({body}, device=cpu({self.device_id}))"


def is_cupy(array: Any) -> bool:
    """True for a CuPy array (checked without importing CuPy).

    >>> is_cupy(np.zeros(1))
    False
    """
    return type(array).__module__.startswith("cupy")


def device_of(array: Any) -> Device:
    """The device an array lives on.

    >>> device_of(np.zeros(1))
    cpu(0)
    """
    if type(array) is np.ndarray:
        return Device("cpu", 0)
    if isinstance(array, DeviceArray):
        return Device("cpu", array.device_id)
    if is_cupy(array):
        return Device("gpu", int(array.device.id))
    if isinstance(array, np.ndarray):
        return Device("cpu", 0)
    if getattr(array, "stype", None) == "row_sparse":  # labkv.sparse.RowSparseArray
        return device_of(array.data)
    raise TypeError(f"not an array: {type(array).__name__}")


def array_module(array: Any) -> ModuleType:
    """``numpy`` or ``cupy``, whichever owns ``array``.

    >>> array_module(np.zeros(1)).__name__
    'numpy'
    """
    if is_cupy(array):
        import cupy

        return cupy
    return np


def _require_cupy(device: Device) -> ModuleType:
    cp = _cupy()
    if cp is None:
        raise RuntimeError(f"{device} needs CuPy and a CUDA GPU; none was found on this machine")
    if device.id >= cp.cuda.runtime.getDeviceCount():
        raise ValueError(f"{device} does not exist: this machine has {num_gpus()} GPU(s)")
    return cp


def _tag_cpu(array: np.ndarray, device_id: int) -> np.ndarray:
    if device_id == 0:
        return array.view(np.ndarray) if type(array) is not np.ndarray else array
    tagged = array.view(DeviceArray)
    tagged.device_id = device_id
    return tagged


def to_device(array: Any, device: Device, copy: bool = True) -> Any:
    """``array`` on ``device``: a numpy array (tagged for simulated CPUs) or a
    CuPy array on that GPU. Always a new array unless ``copy=False`` and the
    array is already there.

    >>> to_device(np.arange(3), cpu(1))
    array([0, 1, 2], device=cpu(1))
    """
    if getattr(array, "stype", None) == "row_sparse":  # labkv.sparse.RowSparseArray
        return array.to_device(device, copy=copy)
    array = as_array(array)
    if device.kind == "cpu":
        host = array.get() if is_cupy(array) else np.array(array, copy=copy)
        return _tag_cpu(host, device.id)
    cp = _require_cupy(device)
    with cp.cuda.Device(device.id):
        if copy or not is_cupy(array) or array.device.id != device.id:
            return cp.array(array, copy=True)
        return array


_HOST = contextlib.nullcontext()


def on_device(device: Device) -> contextlib.AbstractContextManager:
    """The context in which CuPy makes new arrays (and runs kernels) on
    ``device``: CuPy uses the *current* GPU, not the GPU of the arrays it is
    given (``cupy.empty_like(a)`` and ``a.copy()`` land on the current one).
    A no-op for CPU devices.

    >>> with on_device(cpu(0)):
    ...     np.zeros(1).shape
    (1,)
    """
    if device.kind == "cpu":
        return _HOST
    return _require_cupy(device).cuda.Device(device.id)


def empty(shape: Any, dtype: Any, device: Device) -> Any:
    """An uninitialised array on ``device``.

    >>> empty((2,), np.float32, cpu(1)).shape, device_of(empty((2,), np.float32, cpu(1)))
    ((2,), cpu(1))
    """
    if device.kind == "cpu":
        return _tag_cpu(np.empty(shape, dtype), device.id)
    with on_device(device):
        return _require_cupy(device).empty(shape, dtype)


def empty_like(array: Any) -> Any:
    """An uninitialised array of ``array``'s shape and dtype, on its device.

    >>> device_of(empty_like(to_device(np.zeros(3), cpu(2))))
    cpu(2)
    """
    return empty(array.shape, array.dtype, device_of(array))


def new_like(stored: Any, values: Any) -> Any:
    """``values`` (an array of ``stored``'s size) as a new array with
    ``stored``'s shape and dtype, on ``stored``'s device.

    >>> new_like(np.zeros((1, 2), np.float32), np.array([1, 2]))
    array([[1., 2.]], dtype=float32)
    """
    result = empty_like(stored)
    copy_into(result, values.reshape(stored.shape))
    return result


def copy_into(dst: Any, src: Any) -> None:
    """Copy ``src`` into the existing array ``dst`` (casting to its dtype),
    whatever devices the two live on.

    >>> d = np.zeros(2, dtype=np.float32); copy_into(d, np.ones(2)); d
    array([1., 1.], dtype=float32)
    """
    if type(dst) is not np.ndarray and is_cupy(dst):
        import cupy

        with cupy.cuda.Device(dst.device.id):
            if is_cupy(src):
                if src.device.id != dst.device.id:
                    src = cupy.asarray(src)  # peer copy onto dst's GPU
                cupy.copyto(dst, src, casting="unsafe")
            else:
                _host_into_cupy(cupy, dst, src)
        return
    if is_cupy(src):
        src = src.get()
    np.copyto(dst, src, casting="unsafe")


def _host_into_cupy(cupy: ModuleType, dst: Any, src: Any) -> None:
    """Host ``src`` into CuPy ``dst`` (its device current). ``set`` takes only a host
    array of exactly ``dst``'s dtype and shape, into a contiguous ``dst``; ``src`` is
    brought to that form (``np.ascontiguousarray`` would make a 0-d array 1-d), and a
    strided ``dst`` is filled from a device copy."""
    host = np.asarray(src)
    if host.dtype != dst.dtype or host.shape != dst.shape or not host.flags.c_contiguous:
        host = np.broadcast_to(host, dst.shape).astype(dst.dtype, order="C")
    if dst.flags.c_contiguous:
        dst.set(host)
    else:
        cupy.copyto(dst, cupy.asarray(host))


def as_array(value: Any) -> Any:
    """``value`` as a numpy or CuPy array: numpy and CuPy arrays pass through;
    other array objects (a torch tensor, anything with ``__dlpack__`` or
    ``__array__``) are converted, sharing memory where the source allows.

    >>> as_array(np.zeros(2)).shape
    (2,)
    """
    if isinstance(value, np.ndarray) or is_cupy(value):
        return value
    if hasattr(value, "__dlpack_device__"):
        dev_type, dev_id = value.__dlpack_device__()
        if int(dev_type) == 2:  # kDLCUDA: the array lives on a GPU
            return _require_cupy(gpu(dev_id)).from_dlpack(value)
        return np.from_dlpack(value)
    if hasattr(value, "__array__") or hasattr(value, "__array_interface__"):
        return np.asarray(value)
    raise TypeError(
        f"expected an array (numpy, CuPy, or an object with __array__/__dlpack__), "
        f"got {type(value).__name__}"
    )
