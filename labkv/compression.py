"""Gradient compression with residual error feedback (MXNet's 2-bit and 1-bit).

Each device keeps, per key, a residual: the part of its gradients not yet
sent. On a push the gradient is added to the residual, quantised, and what
was sent is subtracted again:

- ``2bit``: send ``+t`` where ``residual >= t``, ``-t`` where ``residual <= -t``,
  else ``0`` (2 bits per value on the wire, 16 values per float32 word);
- ``1bit``: send ``+1`` where ``residual > t``, else ``-1`` (1 bit per value).

All arithmetic is float32, in MXNet's order, so results are bit-identical
to MXNet 1.9.1. :func:`pack_2bit` / :func:`unpack_2bit` give the wire form;
:meth:`GradientCompression.encode` quantises and packs in one pass (what a dist
store's push sends), :func:`wire_piece` cuts a server's piece out of a whole
value's codes, and :func:`sum_from_wire` is the server's decode and sum.

The kernels are whole-array array operations (numpy or CuPy, where the values
live). On numpy they walk the values in blocks of :data:`BLOCK` values, so the
few temporaries of a block stay in the CPU's cache and each value crosses
memory once; CuPy runs each kernel once on the whole array. Unpacking is one
gather from a 256-entry table (a byte's four, or eight, values). Their speed
and the link bandwidth below which 2-bit pays: ``bench/compression.py`` and
docs/performance.md ("2-bit compression: the codec's cost").

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

import functools
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import numpy as np

from .devices import array_module, cpu, device_of, is_cupy, on_device

__all__ = ["GradientCompression", "pack_2bit", "unpack_2bit", "pack_1bit", "unpack_1bit"]

_TYPES = ("none", "2bit", "1bit")

#: Values per block of the numpy kernels: a block's temporaries (some 200 KiB)
#: stay in the CPU's L2 cache. A multiple of 8, so every block packs into whole bytes.
BLOCK = 1 << 15


def _spans(size: int, xp: ModuleType) -> Iterator[slice]:
    """The blocks a kernel works through: numpy's of :data:`BLOCK` values, CuPy's one."""
    step = BLOCK if xp is np else max(size, 1)
    for start in range(0, size, step):
        yield slice(start, min(start + step, size))


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
        # Residual arrays of earlier pushes that nobody holds any more (see
        # :meth:`release`): the next push of their slot writes into them.
        self._spare: dict[tuple[Any, int], Any] = {}

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

    def quantize(self, grad: Any, residual: Any, out: Any = None) -> tuple[Any, Any]:
        """``(sent, new_residual)`` for one device's gradient.

        ``residual`` (float32) is not changed: the new residual is written into
        ``out``, a C-contiguous float32 array of its shape (a new one when None;
        ``residual`` itself to update it in place). ``sent`` is a new array.
        Both are computed block by block (see the module doc): ``residual +
        grad`` goes straight into ``out``, the values sent into ``sent``, and
        the only other temporaries are a block's comparisons.
        """
        return self._quantized(grad, residual, out, packed=False)

    def encode(self, grad: Any, residual: Any, out: Any = None) -> tuple[Any, Any]:
        """``(codes, new_residual)``: :meth:`quantize` with the values sent packed
        as :func:`pack_2bit` (or :func:`pack_1bit`) packs them, where ``residual``
        lives. The float32 values sent are never made whole: each block's are
        packed while they are in the cache (what a compressed push sends).

        >>> gc, grad = GradientCompression("2bit", 0.5), np.float32([0.7, -0.6, 0.1, 0.5])
        >>> codes, residual = gc.encode(grad, np.zeros(4, np.float32))
        >>> sent, same_residual = gc.quantize(grad, np.zeros(4, np.float32))
        >>> codes, pack_2bit(sent, 0.5), np.array_equal(residual, same_residual)
        (array([227], dtype=uint8), array([227], dtype=uint8), True)
        """
        return self._quantized(grad, residual, out, packed=True)

    def _quantized(self, grad: Any, residual: Any, out: Any, packed: bool) -> tuple[Any, Any]:
        xp, size = array_module(residual), residual.size
        new = xp.empty(residual.shape, np.float32) if out is None else out
        if not (new.flags.c_contiguous and new.dtype == np.float32 and new.shape == residual.shape):
            raise ValueError(
                "quantize's out must be a C-contiguous float32 array of the residual's shape"
            )
        old_flat, grad_flat, new_flat = residual.reshape(-1), grad.reshape(-1), new.reshape(-1)
        per_byte = 4 if self.type == "2bit" else 8
        if packed:  # one block's values sent at a time, packed into result
            result = xp.empty(wire_nbytes(self.type, size), np.uint8)
            scratch = xp.empty(min(size, BLOCK) if xp is np else size, np.float32)
        else:
            result = xp.empty(residual.shape, np.float32)
            sent_flat = result.reshape(-1)
        if self.type == "2bit":
            kernel, pack = self._quantize_2bit, _pack_2bit_masks
        else:
            kernel, pack = self._quantize_1bit, _pack_1bit_masks
        for span in _spans(size, xp):
            r = new_flat[span]
            xp.add(old_flat[span], grad_flat[span].astype(np.float32, copy=False), out=r)
            masks = kernel(xp, r, scratch[: r.size] if packed else sent_flat[span])
            if packed:
                result[span.start // per_byte : -(-span.stop // per_byte)] = pack(xp, *masks)
        return result, new

    def _quantize_2bit(self, xp: ModuleType, r: Any, sent: Any) -> tuple[Any, Any]:
        """One block: ``sent = +t, -t or 0`` of ``r``, and ``r -= sent``; returns
        where ``+t`` and where ``-t`` were sent (the codes' bits)."""
        t = np.float32(self.threshold)
        plus, minus = r >= t, r <= -t
        sign = xp.subtract(plus.view(np.int8), minus.view(np.int8))  # 1, -1 or 0
        xp.copyto(sent, sign)
        if np.isfinite(t):
            sent *= t  # exactly +t, -t or +0 (MXNet's 0)
        else:  # t = inf: 0 * inf would be nan
            xp.copyto(sent, xp.where(plus, t, xp.where(minus, -t, np.float32(0))))
        xp.subtract(r, sent, out=r)
        return plus, minus

    def _quantize_1bit(self, xp: ModuleType, r: Any, sent: Any) -> tuple[Any]:
        """One block: ``sent = +1 where r > t, else -1``, and ``r -= sent``;
        returns where ``+1`` was sent (the codes' bits)."""
        plus = r > np.float32(self.threshold)
        xp.copyto(sent, plus)
        sent *= np.float32(2)
        sent -= np.float32(1)  # exactly +1 or -1
        xp.subtract(r, sent, out=r)
        return (plus,)

    def compress(
        self, items: list[tuple[Any, list[Any]]], packed: bool = False
    ) -> tuple[list, Callable[[], dict]]:
        """Quantise every device's value of a push. Returns the values to
        send and a ``commit`` that stores the new residuals, to be called only
        once the push has succeeded (a failed push leaves residuals as they were);
        ``commit()`` returns the residuals it replaced, for :meth:`restore`.
        With ``packed`` each device's values sent come as their wire codes
        (:meth:`encode`, where the value lives), as a dist store's push sends them.

        The new residuals are never written over the current ones (a push that
        fails must leave them): each is computed into a spare array of its slot
        (one a :meth:`release` gave back) or a new one, and replaces the current
        one on commit."""
        quantize = self.encode if packed else self.quantize
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
                    spare = self._spare_for(slot, residual)
                    sent, pending[slot] = quantize(value, residual, spare)
                sent_values.append(sent)
            sent_items.append((key, sent_values))

        def commit() -> dict:
            replaced = {slot: self.residuals.get(slot) for slot in pending}
            self.residuals.update(pending)
            return replaced

        return sent_items, commit

    def _spare_for(self, slot: tuple[Any, int], residual: Any) -> Any:
        """The spare array of ``slot`` if it can take ``residual``'s successor, else None."""
        spare = self._spare.pop(slot, None)
        fits = (
            spare is not None
            and spare is not residual
            and type(spare) is type(residual)
            and spare.shape == residual.shape
            and device_of(spare) == device_of(residual)
        )
        return spare if fits else None

    def release(self, replaced: dict) -> None:
        """The residuals a ``commit`` replaced will not be restored: the next push
        of each slot writes its residual into the array (no new array push after
        push). A local store releases them at once; a dist store keeps them until
        the key's next push, to put back if the servers fail the push, and so
        makes new ones."""
        for slot, residual in replaced.items():
            if residual is not None and self.residuals.get(slot) is not residual:
                self._spare[slot] = residual

    def restore(self, replaced: dict) -> None:
        """Put back residuals that a ``commit`` replaced (a push that failed later)."""
        for slot, residual in replaced.items():
            self._spare.pop(slot, None)  # never the array put back
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


def _where(values: Any) -> Any:
    """The context that makes new arrays where ``values`` live (CuPy: its GPU)."""
    return on_device(device_of(values) if is_cupy(values) else cpu(0))


def pack_2bit(sent: Any, threshold: float, out: Any = None) -> Any:
    """The wire form of 2-bit values: four per byte, ``11`` for ``+t``,
    ``10`` for ``-t``, ``00`` for anything else, first value in the high bits
    (MXNet's layout). Packed where ``sent`` lives (numpy or CuPy, on its GPU),
    into ``out`` when given (``uint8``, :func:`wire_nbytes` long).

    >>> pack_2bit(np.array([0.5, -0.5, 0, 0.5], dtype=np.float32), 0.5)
    array([227], dtype=uint8)
    """
    with _where(sent):
        xp, flat = _on_its_device(sent, np.float32)
        flat = flat.reshape(-1)
        if out is None:
            out = xp.empty(wire_nbytes("2bit", flat.size), np.uint8)
        t = np.float32(threshold)
        for span in _spans(flat.size, xp):
            block = flat[span]
            out[span.start // 4 : -(-span.stop // 4)] = _pack_2bit_masks(
                xp, block == t, block == -t
            )
        return out


def _pack_2bit_masks(xp: ModuleType, plus: Any, minus: Any) -> Any:
    """The packed 2-bit codes of a block (a multiple of 4 values but for the last)
    from where it holds ``+t`` and where ``-t``."""
    # Per value a little-endian 16-bit word whose two bytes are its code's two
    # bits (nonzero, +t): packbits of those bytes is MXNet's layout.
    pairs = xp.empty(plus.size, "<u2")
    xp.copyto(pairs, plus)
    pairs *= np.uint16(257)  # +t: both bytes 1
    pairs += minus  # -t: the low byte 1
    return xp.packbits(pairs.view(np.uint8))


def _pack_1bit_masks(xp: ModuleType, plus: Any) -> Any:
    """The packed 1-bit codes of a block (a multiple of 8 values but for the
    last) from where it holds ``+1``."""
    return xp.packbits(plus)


@functools.lru_cache(maxsize=64)
def _table_2bit(threshold: float) -> np.ndarray:
    """``table[byte]``: the four float32 values a packed byte stands for."""
    t = np.float32(threshold)
    codes = (np.arange(256)[:, None] >> np.array([6, 4, 2, 0])) & 3
    table = np.where(codes == 3, t, np.where(codes == 2, -t, np.float32(0))).astype(np.float32)
    table.flags.writeable = False
    return table


@functools.lru_cache(maxsize=1)
def _table_1bit() -> np.ndarray:
    """``table[byte]``: the eight float32 values (``+1`` or ``-1``) a packed byte stands for."""
    bits = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1)
    table = np.where(bits == 1, np.float32(1), np.float32(-1)).astype(np.float32)
    table.flags.writeable = False
    return table


def _decode(packed: Any, table: np.ndarray, size: int) -> Any:
    """``size`` float32 values of ``packed`` bytes: a gather from ``table``, where
    ``packed`` lives. numpy gathers :data:`BLOCK` bytes at a time straight into
    the result (``take`` into ``out`` with ``mode='clip'``, which a byte never
    needs, is not buffered; the indices it makes of each block stay small)."""
    with _where(packed):
        xp, packed = _on_its_device(packed, np.uint8)
        packed = packed.reshape(-1)
        if xp is not np:
            return xp.asarray(table)[packed].reshape(-1)[:size]
        values = np.empty((packed.size, table.shape[1]), np.float32)
        for span in _spans(packed.size, np):
            np.take(table, packed[span], axis=0, out=values[span], mode="clip")
        return values.reshape(-1)[:size]


def unpack_2bit(packed: Any, threshold: float, size: int) -> Any:
    """Inverse of :func:`pack_2bit`: ``size`` float32 values, where ``packed`` lives."""
    return _decode(packed, _table_2bit(float(threshold)), size)


def pack_1bit(sent: Any, out: Any = None) -> Any:
    """The wire form of 1-bit values: eight per byte, bit set for ``+1`` (any
    value > 0); packed where ``sent`` lives, into ``out`` when given.

    >>> pack_1bit(np.array([1, -1, 1], dtype=np.float32))
    array([160], dtype=uint8)
    """
    with _where(sent):
        xp, flat = _on_its_device(sent, np.float32)
        flat = flat.reshape(-1)
        if out is None:
            out = xp.empty(wire_nbytes("1bit", flat.size), np.uint8)
        for span in _spans(flat.size, xp):
            out[span.start // 8 : -(-span.stop // 8)] = _pack_1bit_masks(xp, flat[span] > 0)
        return out


def unpack_1bit(packed: Any, size: int) -> Any:
    """Inverse of :func:`pack_1bit`: ``size`` float32 values of ``+1`` / ``-1``,
    where ``packed`` lives."""
    return _decode(packed, _table_1bit(), size)


def wire_nbytes(type: str, size: int) -> int:
    """Bytes of ``size`` values packed by :func:`to_wire`: 2 bits (``'2bit'``) or
    1 bit (``'1bit'``) a value, rounded up to whole bytes.

    >>> wire_nbytes("2bit", 1_000_000), wire_nbytes("1bit", 9)
    (250000, 2)
    """
    per_byte = 4 if type == "2bit" else 8
    return -(-size // per_byte)


def wire_piece(type: str, codes: np.ndarray, start: int, stop: int) -> np.ndarray:
    """The codes of values ``start:stop`` cut from ``codes`` (a whole value's, as
    :meth:`GradientCompression.encode` packs it): the bytes :func:`pack_2bit`
    (``'2bit'``) or :func:`pack_1bit` would make of those values alone, their
    first value in the first byte's high bits and the last byte padded with
    zeros. A view when the piece starts and ends on byte bounds, else shifted.

    >>> codes = pack_2bit(np.float32([0.5, -0.5, 0, 0.5, -0.5, 0]), 0.5)
    >>> alone = pack_2bit(np.float32([-0.5, 0, 0.5, -0.5, 0]), 0.5)
    >>> wire_piece("2bit", codes, 1, 6).tolist(), alone.tolist()
    ([142, 0], [142, 0])
    """
    per_byte = 4 if type == "2bit" else 8
    bits = 8 // per_byte
    first, skip = divmod(start, per_byte)
    nbytes, tail = wire_nbytes(type, stop - start), (stop - start) % per_byte
    piece = codes[first : first + nbytes]
    if skip:  # each byte takes the rest of its own and the head of the next
        shift = np.uint8(skip * bits)
        following = codes[first + 1 : first + nbytes + 1]
        piece = piece << shift
        piece[: following.size] |= following >> np.uint8(8 - shift)
    if tail:  # the last byte may hold later values too: zeros instead
        piece = piece if skip else piece.copy()
        piece[-1] &= np.uint8((0xFF << (8 - tail * bits)) & 0xFF)
    return piece


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
        if type == "2bit":
            pack_2bit(values, threshold, out=row)
        else:
            pack_1bit(values, out=row)
    return codes


def from_wire(type: str, threshold: float, codes: np.ndarray, size: int) -> list[np.ndarray]:
    """The per-device float32 values that :func:`to_wire` packed (``size`` each)."""
    if type == "2bit":
        return [unpack_2bit(row, threshold, size) for row in codes]
    return [unpack_1bit(row, size) for row in codes]


def sum_from_wire(type: str, threshold: float, codes: np.ndarray, size: int) -> np.ndarray:
    """The sum of the per-device values that :func:`to_wire` packed: a new float32
    array of ``size``, added left to right in float32 as
    :func:`labkv.reduce.sum_into` adds them (so bit-exact with it), one device
    decoded at a time into the first one's values.

    >>> codes = to_wire("2bit", 0.5, [np.float32([0.5, 0, -0.5])] * 2)
    >>> sum_from_wire("2bit", 0.5, codes, 3).tolist()
    [1.0, 0.0, -1.0]
    """
    if type == "2bit":
        decode = functools.partial(unpack_2bit, threshold=threshold, size=size)
    else:
        decode = functools.partial(unpack_1bit, size=size)
    total = decode(codes[0])  # a new array: added into
    for row in codes[1:]:
        np.add(total, decode(row), out=total)
    return total
