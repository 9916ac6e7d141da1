"""Where a server keeps its values: host memory, or a GPU of its Dask worker.

``server_device`` (an option of ``labkv.create`` and ``run``) is ``'auto'``
(a GPU when the worker has one, through CuPy; else the host), ``'cpu'``,
``'gpu'`` (a GPU, or an error naming the worker) or ``'gpu(i)'``. With
``'auto'``/``'gpu'`` a server takes its worker's own GPU:

- when the worker's ``CUDA_VISIBLE_DEVICES`` is set, its device 0. dask-cuda's
  ``LocalCUDACluster`` gives every worker *all* GPUs, its own first
  (``'3,4,5,6,7,0,1,2'`` for worker 3), and workers pinned by hand see one;
- else (every worker sees every GPU in the same order, as in a plain
  ``LocalCluster`` on a multi-GPU machine) server ``s`` takes GPU ``s % n``, one per
  server.

A GPU ordinal names a different physical GPU in each worker, so the placement
and the monitor show the GPU's PCI bus id next to it (:func:`device_label`).

Values travel between processes as host arrays (Dask's TCP comms copy device
buffers through the host anyway, and a client without a GPU could not
deserialise a CuPy array): a GPU server copies what it receives onto its GPU,
sums and updates there (``Shard`` and ``reduce.sum_into`` are the same code as
the local ``device`` store's), and replies with host copies.

>>> parse_server_device("auto"), parse_server_device("gpu(1)")
('auto', 'gpu(1)')
>>> pick_server_device("cpu", 0)
cpu(0)
"""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from ..devices import Device, array_module, cpu, device_of, empty, gpu, is_cupy, num_gpus, on_device

_GPU_N = re.compile(r"gpu\((\d+)\)")


def parse_server_device(option: str) -> str:
    """Check a ``server_device`` option (raises ``ValueError`` before anything starts)."""
    if option in ("auto", "cpu", "gpu") or (isinstance(option, str) and _GPU_N.fullmatch(option)):
        return option
    raise ValueError(f"server_device must be 'auto', 'cpu', 'gpu' or 'gpu(i)', got {option!r}")


def pick_server_device(option: str, sid: int, where: str = "this worker") -> Device:
    """The device that server ``sid`` keeps its values on under ``option`` (see
    module doc); raises naming ``where`` when the GPU asked for is not there."""
    if option == "cpu":
        return cpu(0)
    count = num_gpus()
    if option == "auto" and count == 0:
        return cpu(0)
    if count == 0:
        raise RuntimeError(
            f"server {sid}: server_device={option!r}, but {where} has no CUDA GPU that CuPy can use"
        )
    if option in ("auto", "gpu"):
        return own_gpu(sid, count)
    index = int(_GPU_N.fullmatch(option).group(1))
    if index >= count:
        raise RuntimeError(
            f"server {sid}: server_device={option!r}, but {where} has {count} GPU(s)"
        )
    return gpu(index)


def own_gpu(sid: int, count: int) -> Device:
    """The worker's own GPU for server ``sid``, of the ``count`` it sees (see module doc).

    >>> own_gpu(1, 2) == (gpu(0) if os.environ.get("CUDA_VISIBLE_DEVICES") else gpu(1))
    True
    """
    if os.environ.get("CUDA_VISIBLE_DEVICES", "").strip():
        return gpu(0)
    return gpu(sid % count)


def device_label(device: Device) -> str:
    """``'gpu(i) pci:<bus id>'`` for a GPU (the physical GPU behind the ordinal), else
    the device's name.

    >>> device_label(cpu(0))
    'cpu(0)'
    """
    if device.kind != "gpu":
        return str(device)
    import cupy

    return f"{device} pci:{cupy.cuda.Device(device.id).pci_bus_id}"


def host_copy(array: Any) -> np.ndarray:
    """A fresh host copy of a stored array (what a reply or a state file carries)."""
    return array.get() if is_cupy(array) else array.copy()


def host_view(array: Any) -> np.ndarray:
    """The array itself on the host, or a host copy of a device array."""
    return array.get() if is_cupy(array) else array


def packed_on_host(arrays: list[Any]) -> np.ndarray:
    """:func:`labkv.cluster._protocol.packing.pack` of stored arrays, with ONE device-to-host
    copy when they live on a GPU: they are laid out in a device buffer first.
    A ``.get()`` per small key would stall the worker's event loop (where a
    server runs) once per key, each a synchronising copy.

    >>> packed_on_host([np.arange(3, dtype=np.int8)]).tolist()
    [0, 1, 2]
    """
    from ._protocol.packing import layout, pack

    if not arrays or not is_cupy(arrays[0]):
        return pack(arrays)
    device = device_of(arrays[0])
    offsets, total = layout([a.nbytes for a in arrays])
    with on_device(device):
        buf = empty(total, np.uint8, device)
        for a, off in zip(arrays, offsets, strict=True):
            if a.nbytes:
                flat = array_module(a).ascontiguousarray(a).reshape(-1)
                buf[off : off + a.nbytes] = flat.view(np.uint8)
        return buf.get()


def warm_up(device: Device) -> None:
    """Run the kernels of a sum and an update once on ``device``: CuPy compiles
    a kernel on first use, which would otherwise stall the first push a GPU
    server serves (and with it every server on its worker's event loop)."""
    if device.kind != "gpu":
        return
    from ..reduce import sum_into

    with on_device(device):
        for dtype in (np.float32, np.float64):
            a = empty(4, dtype, device)
            a[...] = 1
            sum_into(a, [a, a])
            a *= dtype(0.5)
            a += array_module(a).sqrt(a) - a
