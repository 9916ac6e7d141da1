"""A strict CPU stand-in for CuPy, for tests only: numpy underneath, CuPy's device rules on top.

It is importable as ``cupy`` only where a test puts it there (``tests/_standin.py``
loads it into this process; the stand-in cluster's workers put this folder on
``sys.path`` in a preload), so labkv's real CuPy code paths run unchanged against it. It is as
strict as CuPy where CuPy is strict:

- every array knows its device; new arrays (``empty``, ``zeros_like``, ``copy()``,
  ``asarray`` of an array on another GPU) are made on the *current* device, which is
  per thread and starts at device 0 in every thread;
- a kernel (ufunc, reduction, ``vdot``, ``where``, ``astype``, ``copyto``...) raises
  ``ValueError`` when an array operand is not on the current device, as CuPy does;
- ``set()`` needs a numpy array of the exact dtype and shape, and a contiguous
  destination; ``np.asarray`` of an array raises ``TypeError``; numpy arrays are not
  accepted as kernel operands;
- a float scalar beside float arrays is typed by its value, as CuPy (through v13)
  types it: ``float16 array + np.float32(1e-8)`` is a float16 kernel, where it is 0;
- ``from_dlpack`` takes only a producer on a visible CUDA device (``__dlpack_device__``),
  asks it for its capsule with that device current, as CuPy does, and shares its memory;
- ``CUDA_VISIBLE_DEVICES`` (read at import) maps device ordinals onto
  ``LABKV_STANDIN_GPUS`` simulated physical GPUs (default 2), each with its own PCI
  bus id, as the CUDA runtime does for a dask-cuda worker.
"""

from __future__ import annotations

import os
import threading
import types
from typing import Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

__version__ = "0.0-standin"
STANDIN = True

float16, float32, float64 = np.float16, np.float32, np.float64
int8, int16, int32, int64, uint8 = np.int8, np.int16, np.int32, np.int64, np.uint8
bool_, complex64, complex128 = np.bool_, np.complex64, np.complex128
dtype = np.dtype
newaxis = None


class CUDARuntimeError(RuntimeError):
    pass


# -- devices ---------------------------------------------------------------------------
_config: dict[str, Any] = {}
_local = threading.local()


def configure(physical: int | None = None, visible: str | None = None) -> None:
    """Simulate ``physical`` GPUs, of which ``visible`` (a ``CUDA_VISIBLE_DEVICES``
    string, None: all in order) are this process's devices 0, 1, ..."""
    if physical is None:
        physical = int(os.environ.get("LABKV_STANDIN_GPUS", "2"))
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    order = list(range(physical)) if visible is None else []  # "": no GPU, as in CUDA
    if visible:
        for part in visible.split(","):
            index = int(part)
            if not 0 <= index < physical or index in order:
                break  # the CUDA runtime ignores everything from a bad entry on
            order.append(index)
    _config.update(physical=physical, visible=order)


configure()


def _count() -> int:
    return len(_config["visible"])


def _stack() -> list[int]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = [0]
    return stack


def _current() -> int:
    return _stack()[-1]


def _check_ordinal(device_id: int) -> None:
    if not 0 <= device_id < _count():
        raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal")


class Device:
    """A device ordinal; a context manager that makes it current for this thread."""

    def __init__(self, device: Any = None):
        self.id = _current() if device is None else int(device)

    def __enter__(self) -> Device:
        _check_ordinal(self.id)
        _stack().append(self.id)
        return self

    def __exit__(self, *exc: object) -> None:
        _stack().pop()

    def use(self) -> None:
        _check_ordinal(self.id)
        _stack()[-1] = self.id

    def synchronize(self) -> None:
        _check_ordinal(self.id)

    @property
    def pci_bus_id(self) -> str:
        _check_ordinal(self.id)
        return f"0000:{0x10 + _config['visible'][self.id]:02X}:00.0"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id}>"


def _get_device_count() -> int:
    return _count()


runtime = types.SimpleNamespace(
    getDeviceCount=_get_device_count,
    getDevice=lambda: _current(),
    deviceSynchronize=lambda: _check_ordinal(_current()),
    CUDARuntimeError=CUDARuntimeError,
)
cuda = types.SimpleNamespace(Device=Device, runtime=runtime, is_available=lambda: _count() > 0)


# -- arrays ----------------------------------------------------------------------------
#: What the tests count: device-to-host copies, and kernels run per device ordinal.
stats: dict[str, Any] = {"to_host": 0, "kernels": {}}


def _kernel(*operands: Any) -> int:
    """The device a kernel runs on (the current one); every array operand must be there."""
    current = _current()
    _check_ordinal(current)
    stats["kernels"][current] = stats["kernels"].get(current, 0) + 1
    for operand in operands:
        if isinstance(operand, ndarray):
            if operand._device != current:
                raise ValueError(
                    "Array device must be same as the current device: "
                    f"array device = {operand._device} while current = {current}"
                )
        elif isinstance(operand, np.ndarray):
            raise TypeError(f"Unsupported type {type(operand)}")
    return current


_KIND_SCORE = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


def _typed_as_cupy(operands: Any) -> tuple:
    """The operands of an elementwise kernel, a float scalar typed as CuPy types it.

    CuPy (through v13) types a scalar beside arrays of the same or a higher kind by
    its value (numpy's legacy ``min_scalar_type``), not by its dtype, then casts it to
    the kernel's type: with a float16 array, ``np.float32(1e-8)`` makes a float16
    kernel in which it is 0. numpy 2 (NEP 50) would run that kernel in float32.
    """
    kinds = [_KIND_SCORE.get(o.dtype.kind, 4) for o in operands if isinstance(o, ndarray)]
    scalars = [o for o in operands if isinstance(o, (float, np.floating))]
    if not scalars or not kinds or max(kinds) < _KIND_SCORE["f"]:
        return tuple(operands)
    inexact = [o.dtype for o in operands if isinstance(o, ndarray) and o.dtype.kind in "fc"]
    kernel = np.result_type(*inexact, *(np.min_scalar_type(o) for o in scalars))
    return tuple(kernel.type(o) if isinstance(o, (float, np.floating)) else o for o in operands)


def _wrap(data: Any, device: int) -> Any:
    if isinstance(data, tuple):
        return tuple(_wrap(d, device) for d in data)
    if isinstance(data, (np.ndarray, np.generic)):
        return ndarray._of(np.asarray(data), device)
    return data


def _data(value: Any) -> Any:
    return value._data if isinstance(value, ndarray) else value


class _Flags:
    def __init__(self, data: np.ndarray):
        self.c_contiguous = bool(data.flags.c_contiguous)
        self.f_contiguous = bool(data.flags.f_contiguous)


class ndarray(NDArrayOperatorsMixin):
    """An array on one simulated GPU (see module doc)."""

    __array_priority__ = 100

    def __init__(self, shape: Any, dtype: Any = float):
        self._data = np.empty(shape, dtype)
        self._device = _kernel()

    @classmethod
    def _of(cls, data: np.ndarray, device: int) -> ndarray:
        array = cls.__new__(cls)
        array._data, array._device = data, device
        return array

    # attributes
    shape = property(lambda self: self._data.shape)
    dtype = property(lambda self: self._data.dtype)
    size = property(lambda self: self._data.size)
    ndim = property(lambda self: self._data.ndim)
    nbytes = property(lambda self: self._data.nbytes)
    itemsize = property(lambda self: self._data.itemsize)
    strides = property(lambda self: self._data.strides)
    flags = property(lambda self: _Flags(self._data))
    device = property(lambda self: Device(self._device))
    T = property(lambda self: ndarray._of(self._data.T, self._device))
    real = property(lambda self: ndarray._of(self._data.real, self._device))
    imag = property(lambda self: ndarray._of(self._data.imag, self._device))

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"array({self._data.tolist()!r}, dtype={self.dtype}, device={self._device})"

    # no implicit host conversion
    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError(
            "Implicit conversion to a NumPy array is not allowed. "
            "Please use `.get()` to construct a NumPy array explicitly."
        )

    def __iter__(self):
        raise TypeError("iterating over a GPU array element by element is not supported here")

    def _scalar(self) -> Any:
        if self.size != 1:
            raise TypeError("only size-1 arrays convert to Python scalars")
        return self._data.reshape(()).item()

    def __float__(self) -> float:
        return float(self._scalar())

    def __int__(self) -> int:
        return int(self._scalar())

    def __bool__(self) -> bool:
        return bool(self._scalar())

    def item(self) -> Any:
        return self._scalar()

    # host transfers (any current device)
    def get(self, stream: Any = None, order: str = "C", out: Any = None) -> np.ndarray:
        stats["to_host"] += 1
        if out is None:
            return np.array(self._data, order=order, copy=True)
        if not isinstance(out, np.ndarray):
            raise TypeError("Only numpy.ndarray can be obtained from cupy.ndarray")
        if out.dtype != self.dtype:
            raise TypeError(f"{self.dtype} array cannot be obtained to {out.dtype} array")
        if out.shape != self.shape:
            raise ValueError(f"Shape mismatch. Old shape: {out.shape}, new shape: {self.shape}")
        out[...] = self._data
        return out

    def set(self, arr: Any, stream: Any = None) -> None:
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if self.dtype != arr.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if self.shape != arr.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        if not (self._data.flags.c_contiguous or self._data.flags.f_contiguous):
            raise RuntimeError("Cannot set to non-contiguous array")
        self._data[...] = arr

    # views keep the device; copies and kernels follow CuPy's rules
    def reshape(self, *shape: Any, order: str = "C") -> ndarray:
        view = self._data.reshape(*shape, order=order)
        if not np.may_share_memory(view, self._data) and view.size:
            _kernel(self)
        return ndarray._of(view, self._device)

    def ravel(self, order: str = "C") -> ndarray:
        return self.reshape(-1, order=order)

    def view(self, dtype: Any = None) -> ndarray:
        return ndarray._of(self._data.view(dtype) if dtype else self._data.view(), self._device)

    def __getitem__(self, index: Any) -> ndarray:
        index = _device_index(self, index)
        return _wrap(self._data[index], self._device)

    def __setitem__(self, index: Any, value: Any) -> None:
        index = _device_index(self, index)
        if isinstance(value, np.ndarray):
            value = asarray(value)  # CuPy copies a host value over first
        _kernel(self, value)
        self._data[index] = _data(value)

    def copy(self, order: str = "C") -> ndarray:
        # CuPy: "makes a copy of a given array in the current device"
        return ndarray._of(np.array(self._data, order=order, copy=True), _kernel())

    def astype(self, dtype: Any, order: str = "K", casting: Any = None, copy: bool = True):
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        device = _kernel(self)
        return ndarray._of(self._data.astype(dtype, order=order), device)

    def fill(self, value: Any) -> None:
        _kernel(self)
        self._data.fill(value)

    def _reduce(self, name: str, *args: Any, **kwargs: Any) -> Any:
        device = _kernel(self)
        out = kwargs.get("out")
        if out is not None:
            _kernel(out)
            kwargs["out"] = out._data
            getattr(self._data, name)(*args, **kwargs)
            return out
        return _wrap(np.asarray(getattr(self._data, name)(*args, **kwargs)), device)

    def min(self, *a: Any, **k: Any) -> Any:
        return self._reduce("min", *a, **k)

    def max(self, *a: Any, **k: Any) -> Any:
        return self._reduce("max", *a, **k)

    def sum(self, *a: Any, **k: Any) -> Any:
        return self._reduce("sum", *a, **k)

    def mean(self, *a: Any, **k: Any) -> Any:
        return self._reduce("mean", *a, **k)

    def all(self, *a: Any, **k: Any) -> Any:
        return self._reduce("all", *a, **k)

    def any(self, *a: Any, **k: Any) -> Any:
        return self._reduce("any", *a, **k)

    def dot(self, other: Any) -> Any:
        device = _kernel(self, other)
        return _wrap(np.asarray(self._data.dot(other._data)), device)

    # numpy protocols: every ufunc is a kernel; other numpy functions only on stand-ins
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        out = kwargs.pop("out", None)
        outs = out if isinstance(out, tuple) else () if out is None else (out,)
        device = _kernel(*inputs, *outs)
        if outs:
            kwargs["out"] = tuple(_data(o) for o in outs)
        if method == "__call__":
            inputs = _typed_as_cupy(inputs)
        result = getattr(ufunc, method)(*(_data(i) for i in inputs), **kwargs)
        if outs:
            return outs[0] if len(outs) == 1 else outs
        return _wrap(result, device)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        mine = globals().get(func.__name__)
        if mine is None or not all(issubclass(t, ndarray) for t in types):
            return NotImplemented
        return mine(*args, **kwargs)


def _device_index(array: ndarray, index: Any) -> Any:
    """An index as numpy takes it. An index array must be on the current device with
    ``array`` (CuPy first copies a host index array onto the current device, so a
    host index is checked as one made there)."""
    if isinstance(index, ndarray):
        _kernel(array, index)
        return index._data
    if isinstance(index, np.ndarray) and index.dtype.kind in "biu" and index.ndim:
        _kernel(array)
    return index


# -- module functions (new arrays land on the current device) --------------------------
def _new(data: np.ndarray) -> ndarray:
    return ndarray._of(data, _kernel())


def empty(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    return _new(np.empty(shape, dtype, order))


def zeros(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    return _new(np.zeros(shape, dtype, order))


def ones(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    return _new(np.ones(shape, dtype, order))


def full(shape: Any, fill_value: Any, dtype: Any = None, order: str = "C") -> ndarray:
    return _new(np.full(shape, fill_value, dtype, order))


def arange(*args: Any, **kwargs: Any) -> ndarray:
    return _new(np.arange(*args, **kwargs))


def _like(maker: Any, a: ndarray, dtype: Any, *fill: Any) -> ndarray:
    return _new(maker(a.shape, *fill, dtype=a.dtype if dtype is None else dtype))


def empty_like(a: ndarray, dtype: Any = None) -> ndarray:
    return _like(np.empty, a, dtype)


def zeros_like(a: ndarray, dtype: Any = None) -> ndarray:
    return _like(np.zeros, a, dtype)


def ones_like(a: ndarray, dtype: Any = None) -> ndarray:
    return _like(np.ones, a, dtype)


def full_like(a: ndarray, fill_value: Any, dtype: Any = None) -> ndarray:
    return _like(np.full, a, dtype, fill_value)


def array(obj: Any, dtype: Any = None, copy: bool = True, order: str = "K", ndmin: int = 0):
    """A copy on the current device: from the host, or from any GPU (a peer copy)."""
    host = obj._data if isinstance(obj, ndarray) else obj
    return _new(np.array(host, dtype=dtype, copy=True, order=order, ndmin=ndmin))


def asarray(a: Any, dtype: Any = None, order: Any = None) -> ndarray:
    if (
        isinstance(a, ndarray)
        and a._device == _current()
        and (dtype is None or np.dtype(dtype) == a.dtype)
    ):
        return a
    return array(a, dtype=dtype)


def ascontiguousarray(a: ndarray, dtype: Any = None) -> ndarray:
    if a._data.flags.c_contiguous and (dtype is None or np.dtype(dtype) == a.dtype):
        return a
    device = _kernel(a)
    return ndarray._of(np.ascontiguousarray(a._data, dtype=dtype), device)


def copyto(dst: ndarray, src: Any, casting: str = "same_kind", where: Any = True) -> None:
    if not isinstance(dst, ndarray):
        raise TypeError(f"Unsupported type {type(dst)}")
    _kernel(dst, src, where)
    np.copyto(dst._data, _data(src), casting=casting, where=_data(where))


def _function(name: str) -> Any:
    numpy_function = getattr(np, name)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        arrays = [a for a in args if isinstance(a, (ndarray, np.ndarray))]
        if isinstance(args[0], (list, tuple)):  # stack, concatenate
            arrays = list(args[0])
            args = ([_data(a) for a in args[0]], *args[1:])
        out = kwargs.get("out")
        device = _kernel(*arrays, *([out] if out is not None else []))
        if not any(isinstance(a, ndarray) for a in arrays):
            raise TypeError(f"cupy.{name} needs a cupy array argument")
        if out is not None:
            kwargs["out"] = out._data
        if name in _ELEMENTWISE:
            args = _typed_as_cupy(args)
        result = numpy_function(*(_data(a) for a in args), **kwargs)
        return out if out is not None else _wrap(np.asarray(result), device)

    kernel.__name__ = name
    return kernel


_ELEMENTWISE = {
    "add",
    "subtract",
    "multiply",
    "divide",
    "true_divide",
    "maximum",
    "minimum",
    "clip",
    "where",
}

for _name in [
    "add",
    "subtract",
    "multiply",
    "divide",
    "true_divide",
    "negative",
    "sqrt",
    "square",
    "sign",
    "abs",
    "absolute",
    "maximum",
    "minimum",
    "exp",
    "log",
    "clip",
    "where",
    "stack",
    "concatenate",
    "vdot",
    "dot",
    "packbits",
    "unpackbits",
    "isfinite",
    "isnan",
    "sum",
    "mean",
    "prod",
]:
    globals()[_name] = _function(_name)


def get_array_module(*args: Any) -> types.ModuleType:
    import sys

    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else np


def asnumpy(a: Any) -> np.ndarray:
    return a.get() if isinstance(a, ndarray) else np.asarray(a)


class _HostCapsule:
    """A capsule of host memory (a simulated GPU's) as numpy's ``from_dlpack`` takes it."""

    def __init__(self, capsule: Any):
        self.capsule = capsule

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


def from_dlpack(array: Any) -> ndarray:
    """A view of a DLPack producer's memory on its GPU, as CuPy takes it: the
    producer's ``__dlpack_device__`` must be a visible CUDA device (a CPU one is
    refused, as by CuPy), its ``__dlpack__`` is called with that device current
    and CuPy's stream (the legacy default stream, 1), and the array shares the
    memory of the capsule it returns (host memory here: the simulated GPU's).
    A bare capsule (CuPy's legacy form) is refused: its device is not known."""
    if not hasattr(array, "__dlpack_device__"):
        raise TypeError("the CuPy stand-in takes no bare DLPack capsules")
    dev_type, dev_id = array.__dlpack_device__()
    if int(dev_type) == 1:  # kDLCPU
        raise TypeError(
            "CPU arrays cannot be directly imported to CuPy. "
            "Use `cupy.array(numpy.from_dlpack(input))` instead."
        )
    if int(dev_type) not in (2, 13):  # kDLCUDA, kDLCUDAManaged
        raise TypeError(f"Unsupported array type: {dev_type}")
    with Device(dev_id):
        capsule = array.__dlpack__(stream=1, max_version=(1, 0), copy=None)
    return ndarray._of(np.from_dlpack(_HostCapsule(capsule)), int(dev_id))
