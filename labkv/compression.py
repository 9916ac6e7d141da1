"""Gradient compression with residual error feedback (MXNet's 2-bit and 1-bit).

Each device keeps, per key, a residual: the part of its gradients not yet
sent. On a push the gradient is added to the residual, quantised, and what
was sent is subtracted again:

- ``2bit``: send ``+t`` where ``residual >= t``, ``-t`` where ``residual <= -t``,
  else ``0`` (2 bits per value on the wire, 16 values per float32 word);
- ``1bit``: send ``+1`` where ``residual > t``, else ``-1`` (1 bit per value).

All arithmetic is float32, in MXNet's order, so results are bit-identical
to MXNet 1.9.1. :func:`pack_2bit` / :func:`unpack_2bit` give the wire form.

>>> import numpy as np
>>> gc = GradientCompression("2bit", 0.5)
>>> residual = np.zeros(3, dtype=np.float32)
>>> sent, residual = gc.quantize(np.array([0.7, -0.2, -0.6], dtype=np.float32), residual)
>>> sent
array([ 0.5,  0. , -0.5], dtype=float32)
>>> residual
array([ 0.19999999, -0.2       , -0.10000002], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from .devices import array_module, cpu, device_of, is_cupy, on_device

__all__ = ["GradientCompression", "pack_2bit", "unpack_2bit", "pack_1bit", "unpack_1bit"]

_TYPES = ("none", "2bit", "1bit")


class GradientCompression:
    """The compression settings of a store and the residuals of its devices."""

    def __init__(self, type: str = "2bit", threshold: float | None = None):
        kind = str(type).lower()
        if kind not in _TYPES:
            raise ValueError(f"unknown gradient compression type {type!r}; known: {list(_TYPES)}")
        if threshold is None:
            threshold = 0.5 if kind == "2bit" else 0.0
        threshold = float(threshold)
        if kind == "2bit" and not threshold > 0:
            raise ValueError(f"2bit compression needs a threshold > 0, got {threshold}")
        self.type = kind
        self.threshold = threshold
        self.residuals: dict[tuple[Any, int], Any] = {}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> GradientCompression:
        """Build from MXNet's ``{'type': '2bit', 'threshold': 0.5}`` dict."""
        if not isinstance(params, dict):
            raise TypeError(f"compression params must be a dict, got {type(params).__name__}")
        unknown = set(params) - {"type", "threshold"}
        if unknown:
            raise ValueError(f"unknown gradient compression parameters {sorted(unknown)}")
        if "type" not in params:
            raise ValueError("gradient compression params need a 'type'")
        return cls(params["type"], params.get("threshold"))

    def params(self) -> dict[str, Any]:
        return {"type": self.type, "threshold": self.threshold}

    def check(self, key: Any, dtype: np.dtype) -> None:
        """Refuse keys the compression does not apply to (it is float32 only)."""
        if dtype != np.float32:
            raise TypeError(
                f"gradient compression applies to float32 values only; key {key!r} is {dtype}"
            )

    def quantize(self, grad: Any, residual: Any) -> tuple[Any, Any]:
        """``(sent, new_residual)`` for one device's gradient; nothing is changed in place."""
        xp = array_module(residual)
        f32 = np.float32
        r = residual + grad.astype(f32, copy=False)
        if self.type == "2bit":
            t = f32(self.threshold)
            sent = xp.where(r >= t, t, xp.where(r <= -t, -t, f32(0)))
        else:
            sent = xp.where(r > f32(self.threshold), f32(1), f32(-1))
        sent = sent.astype(f32, copy=False)
        return sent, r - sent

    def compress(self, items: list[tuple[Any, list[Any]]]) -> tuple[list, Callable[[], dict]]:
        """Quantise every device's value of a push. Returns the values to
        send and a ``commit`` that stores the new residuals, to be called only
        once the push has succeeded (a failed push leaves residuals as they were);
        ``commit()`` returns the residuals it replaced, for :meth:`restore`."""
        sent_items, pending = [], {}
        for key, values in items:
            sent_values = []
            for position, value in enumerate(values):
                slot = (key, position)
                residual = pending.get(slot)
                if residual is None:
                    residual = self.residuals.get(slot)
                with on_device(device_of(value)):  # CuPy works on the current GPU
                    if residual is None:
                        residual = array_module(value).zeros(value.shape, dtype=np.float32)
                    sent, pending[slot] = self.quantize(value, residual)
                sent_values.append(sent)
            sent_items.append((key, sent_values))

        def commit() -> dict:
            replaced = {slot: self.residuals.get(slot) for slot in pending}
            self.residuals.update(pending)
            return replaced

        return sent_items, commit

    def restore(self, replaced: dict) -> None:
        """Put back residuals that a ``commit`` replaced (a push that failed later)."""
        for slot, residual in replaced.items():
            if residual is None:
                self.residuals.pop(slot, None)
            else:
                self.residuals[slot] = residual


def _on_its_device(values: Any, dtype: Any) -> tuple[ModuleType, Any]:
    """The array module of ``values`` and ``values`` as an array of ``dtype`` there
    (CuPy refuses ``np.asarray`` of its arrays: they are never converted here)."""
    if not is_cupy(values):
        values = np.asarray(values)
    return array_module(values), values.astype(dtype, copy=False)


def pack_2bit(sent: Any, threshold: float) -> Any:
    """The wire form of 2-bit values: four per byte, ``11`` for ``+t``,
    ``10`` for ``-t``, ``00`` for 0, first value in the high bits (MXNet's layout).
    Packed where ``sent`` lives (numpy or CuPy, on its GPU).

    >>> pack_2bit(np.array([0.5, -0.5, 0, 0.5], dtype=np.float32), 0.5)
    array([227], dtype=uint8)
    """
    with on_device(device_of(sent) if is_cupy(sent) else cpu(0)):
        xp, flat = _on_its_device(sent, np.float32)
        flat = flat.reshape(-1)
        t = np.float32(threshold)
        codes = xp.where(flat == t, np.uint8(3), xp.where(flat == -t, np.uint8(2), np.uint8(0)))
        codes = codes.astype(np.uint8, copy=False)
        padding = -flat.size % 4
        if padding:
            codes = xp.concatenate([codes, xp.zeros(padding, dtype=np.uint8)])
        codes = codes.reshape(-1, 4)
        return (codes[:, 0] << 6) | (codes[:, 1] << 4) | (codes[:, 2] << 2) | codes[:, 3]


def unpack_2bit(packed: Any, threshold: float, size: int) -> Any:
    """Inverse of :func:`pack_2bit`: ``size`` float32 values, where ``packed`` lives."""
    with on_device(device_of(packed) if is_cupy(packed) else cpu(0)):
        xp, packed = _on_its_device(packed, np.uint8)
        codes = xp.stack([(packed >> s) & 3 for s in (6, 4, 2, 0)], axis=1).reshape(-1)[:size]
        t = np.float32(threshold)
        values = xp.where(codes == 3, t, xp.where(codes == 2, -t, np.float32(0)))
        return values.astype(np.float32, copy=False)


def pack_1bit(sent: Any) -> Any:
    """The wire form of 1-bit values: eight per byte, bit set for ``+1``; packed
    where ``sent`` lives.

    >>> pack_1bit(np.array([1, -1, 1], dtype=np.float32))
    array([160], dtype=uint8)
    """
    with on_device(device_of(sent) if is_cupy(sent) else cpu(0)):
        xp, flat = _on_its_device(sent, np.float32)
        return xp.packbits(flat.reshape(-1) > 0)


def unpack_1bit(packed: Any, size: int) -> Any:
    """Inverse of :func:`pack_1bit`: ``size`` float32 values of ``+1`` / ``-1``,
    where ``packed`` lives."""
    with on_device(device_of(packed) if is_cupy(packed) else cpu(0)):
        xp, packed = _on_its_device(packed, np.uint8)
        bits = xp.unpackbits(packed)[:size]
        return xp.where(bits == 1, np.float32(1), np.float32(-1)).astype(np.float32, copy=False)


def wire_nbytes(type: str, size: int) -> int:
    """Bytes of ``size`` values packed by :func:`to_wire`: 2 bits (``'2bit'``) or
    1 bit (``'1bit'``) a value, rounded up to whole bytes.

    >>> wire_nbytes("2bit", 1_000_000), wire_nbytes("1bit", 9)
    (250000, 2)
    """
    per_byte = 4 if type == "2bit" else 8
    return -(-size // per_byte)


def to_wire(type: str, threshold: float, sent: list[Any]) -> np.ndarray:
    """Per-device compressed values (host arrays of one piece, each ``+-t`` or
    0 for 2-bit, ``+-1`` for 1-bit) as one ``uint8`` array of shape
    ``(devices, wire_nbytes)``: what a compressed push carries instead of float32.

    >>> codes = to_wire("2bit", 0.5, [np.array([0.5, 0, -0.5], np.float32)])
    >>> codes.shape, from_wire("2bit", 0.5, codes, 3)[0].tolist()
    ((1, 1), [0.5, 0.0, -0.5])
    """
    size = int(sent[0].size)
    codes = np.empty((len(sent), wire_nbytes(type, size)), dtype=np.uint8)
    for row, values in zip(codes, sent, strict=True):
        row[:] = pack_2bit(values, threshold) if type == "2bit" else pack_1bit(values)
    return codes


def from_wire(type: str, threshold: float, codes: np.ndarray, size: int) -> list[np.ndarray]:
    """The per-device float32 values that :func:`to_wire` packed (``size`` each)."""
    if type == "2bit":
        return [unpack_2bit(row, threshold, size) for row in codes]
    return [unpack_1bit(row, size) for row in codes]
