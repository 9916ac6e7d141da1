"""How torch tensors travel to and from a store (for :mod:`labkv.torch`).

- **CPU tensors** go as numpy views of their own memory (``t.detach().numpy()``):
  a push reads the tensor, a pull writes into it, no copy on the way.
- **CUDA tensors** go through DLPack as CuPy arrays on the same GPU
  (``cupy.from_dlpack``), so they never pass through the host unless the store
  keeps its values there; without CuPy the error says so.
- **float16 and bfloat16** tensors travel and are stored as **float32** (numpy has
  no bfloat16, gradient compression takes float32 only, and the servers'
  optimizers then keep float32 weights, as MXNet's ``multi_precision`` does): a
  push casts to float32 (exact), a pull writes a float32 buffer and copies it
  back into the tensor, rounding to nearest.

>>> import torch
>>> t = torch.zeros(3)
>>> view = store_array(t, "w")
>>> view[:] = 2.0
>>> t
tensor([2., 2., 2.])
>>> store_array(torch.ones(2, dtype=torch.bfloat16), "b").dtype
dtype('float32')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

#: The dtypes that travel as float32.
HALF = (torch.float16, torch.bfloat16)


def wire_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype ``t`` is stored with: float32 for a half-precision tensor, its own otherwise.

    >>> wire_dtype(torch.zeros(1, dtype=torch.float16))
    torch.float32
    """
    return torch.float32 if t.dtype in HALF else t.dtype


def _cupy(name: str, device: torch.device) -> Any:
    try:
        import cupy
    except ImportError:
        raise RuntimeError(
            f"{name!r} is a torch CUDA tensor (on {device}): labkv hands CUDA tensors to the "
            "store through DLPack as CuPy arrays, and CuPy is not importable here; install "
            "it (pip install 'labkv[gpu]', cupy-cuda12x) or move the model to the CPU"
        ) from None
    return cupy


def store_array(t: torch.Tensor, name: str) -> Any:
    """``t`` as an array a store reads and writes: a numpy view of a CPU tensor,
    a CuPy view of a CUDA one (both share ``t``'s memory), or a float32 copy of
    a half-precision tensor. ``name`` is used in errors."""
    if t.layout != torch.strided:
        raise TypeError(f"{name!r} is a {t.layout} tensor; labkv.torch takes dense tensors only")
    t = t.detach()
    if t.dtype in HALF:
        t = t.to(torch.float32)
    if t.device.type == "cpu":
        return t.numpy()
    if t.device.type == "cuda":
        return _cupy(name, t.device).from_dlpack(t)
    raise TypeError(f"{name!r} is on {t.device}; labkv.torch takes CPU and CUDA tensors")


def pull_into(
    kvstore: Any, names: Sequence[str], tensors: Sequence[torch.Tensor], divide: int = 1
) -> None:
    """Pull ``names`` into ``tensors`` in one call, in place (their memory is
    the pull's ``out`` unless they are half precision), then divide by
    ``divide`` (in float32 for half-precision tensors, before the cast back).

    >>> import labkv
    >>> kv = labkv.create()
    >>> kv.init("g", torch.full((2,), 6.0).numpy())
    >>> t = torch.zeros(2, dtype=torch.bfloat16)
    >>> pull_into(kv, ["g"], [t], divide=4)
    >>> t
    tensor([1.5000, 1.5000], dtype=torch.bfloat16)
    """
    if not names:
        return
    outs, pairs = [], []
    for name, t in zip(names, tensors, strict=True):
        t = t.detach()
        # on t's device: a CUDA tensor's float32 buffer stays on its GPU
        buffer = t.new_empty(t.shape, dtype=torch.float32) if t.dtype in HALF else t
        outs.append(store_array(buffer, name))
        pairs.append((t, buffer))
    kvstore.pull(list(names), out=outs)
    with torch.no_grad():
        for t, buffer in pairs:
            if divide != 1:
                buffer.div_(divide)
            if buffer is not t:
                t.copy_(buffer)
