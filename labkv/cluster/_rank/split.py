"""A rank's side of the wire, as plain functions: checked ``[(key, [arrays])]``
into one :class:`~labkv.cluster._protocol.messages.Push` per server, and the servers' pieces back into
the caller's outs. No Dask, no event loop: ``meta`` is the store's ``{key:
(shape, dtype)}`` and ``pieces`` its ``{key: [Piece]}`` (see :mod:`._placement`).

>>> import numpy as np
>>> from labkv.cluster._placement import Piece
>>> pieces = {"w": [Piece(0, 0, 2), Piece(1, 2, 4)]}
>>> [(s, p.tolist()) for s, p in split(np.arange(4.0), pieces["w"])]
[(0, [0.0, 1.0]), (1, [2.0, 3.0])]
>>> join([np.arange(2.0), np.arange(2.0, 4.0)], (2, 2)).tolist()
[[0.0, 1.0], [2.0, 3.0]]
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Container
from typing import Any

import cloudpickle
import numpy as np

from ...compression import GradientCompression, wire_piece
from ...devices import copy_into, device_of, empty
from ...reduce import sum_into
from ...sparse import is_row_sparse
from .._device import host_view
from .._placement import ORDER_RULE, Piece
from .._protocol.messages import Codes, Push, PushHeader, pack_values
from .._protocol.packing import PACK_BELOW
from .._rows.rank import kept_rows, row_pieces, rows_of_batch, same_rows

Meta = dict  # key -> (shape, np.dtype)
Pieces = dict  # key -> [Piece]


def host(array: Any) -> np.ndarray:
    """A plain, C-contiguous numpy array (no copy when it already is one)."""
    return np.asarray(host_view(array), order="C")


def split(array: Any, pieces: list[Piece]) -> list[tuple[int, Any]]:
    """``(server, part)`` of a value placed as ``pieces``: the array itself on
    one server, or one flat slice (a view) per server."""
    if len(pieces) == 1:
        return [(pieces[0].server, array)]
    flat = array.reshape(-1)
    return [(p.server, flat[p.start : p.stop]) for p in pieces]


def join(parts: list[Any], shape: tuple, dtype: Any = None) -> np.ndarray:
    """The host array of ``shape`` that :func:`split` cut into ``parts``."""
    if len(parts) == 1:
        whole = np.asarray(parts[0])
    else:
        whole = np.concatenate([np.ravel(p) for p in parts])
    return (whole if dtype is None else whole.astype(dtype, copy=False)).reshape(shape)


def piece_spec(meta: Meta, pieces: Pieces, s: int, key: Any) -> tuple[np.dtype, tuple]:
    """``(dtype, shape)`` of the piece of ``key`` that server ``s`` holds."""
    shape, dtype = meta[key]
    placed = pieces[key]
    if len(placed) > 1:
        p = placed[s]  # a sliced key has slice s on server s
        shape = (p.stop - p.start,)
    return dtype, shape


def compressed_pieces(
    compression: GradientCompression, placed: list[Piece], values: list[Any]
) -> list[tuple[int, np.ndarray]]:
    """``(server, codes)`` of a compressed push of one key: ``values`` are each
    device's codes of the whole value (``GradientCompression.compress(...,
    packed=True)``), and per piece its rows are every device's codes of that
    piece (:func:`labkv.compression.wire_piece`: the rows
    :func:`labkv.compression.to_wire` makes of the piece's values); the server
    unpacks and sums them as this rank would have (pushes shrink 16x for float32
    at 2 bits; pulls stay uncompressed, as in MXNet)."""
    per_device = [host(v) for v in values]  # a GPU's codes come over, 1/16 of its values
    return [
        (p.server, np.stack([wire_piece(compression.type, c, p.start, p.stop) for c in per_device]))
        for p in placed
    ]


def per_server(
    items: list,
    meta: Meta,
    pieces: Pieces,
    compression: GradientCompression | None,
    sparse: Container = (),
) -> tuple[dict[int, list[tuple[Any, Any]]], int]:
    """``{server: [(key, piece)]}`` of a push and the bytes it sends. Per-device
    values are summed here first (on their device when they share one), so one
    array per key crosses the network; with ``compression`` each piece is the
    codes of every device instead; a row-sparse push sends each server its rows
    (:func:`labkv.cluster._rows.rank.row_pieces`; ``sparse``: the row-sparse keys)."""
    out: dict[int, list] = defaultdict(list)
    nbytes = 0
    for key, values in items:
        if is_row_sparse(values[0]):
            for s, rows in row_pieces(values, meta[key], pieces[key], key, key in sparse):
                nbytes += rows.nbytes
                out[s].append((key, rows))
            continue
        if compression is not None:  # each device's values, 2 (or 1) bits each
            for s, codes in compressed_pieces(compression, pieces[key], values):
                nbytes += codes.nbytes
                out[s].append((key, codes))
            continue
        shape, dtype = meta[key]
        if len(values) == 1:
            value = values[0]
        else:
            value = empty(shape, dtype, device_of(values[0]))
            sum_into(value, values)
        value = host(value)
        nbytes += value.nbytes
        for s, piece in split(value, pieces[key]):
            out[s].append((key, piece))
    return out, nbytes


def _same(array: Any) -> Any:
    return array


def push_message(
    header: tuple[str, int, int],
    batch: list[tuple[Any, Any]],
    meta: Meta,
    copy: bool,
    same_process: bool,
    compression: GradientCompression | None = None,
    step: int | None = None,
) -> Push:
    """One server's push of ``batch`` (``header``: sender, rank, seq): the small
    values packed into one buffer (a copy), the big ones as they are, or copied
    when ``copy`` (a push not waited for: the caller may reuse its arrays at
    once). A waited-for push to a server in this process lends it the caller's
    arrays (``borrowed``: it copies what it keeps). With ``compression`` every
    value is the packed codes of its devices (fresh arrays: never copied)."""
    codes, dtypes = None, None
    batch, rows = rows_of_batch(batch)  # a row-sparse value's data, its rows in the header
    if compression is not None:
        copy = False
        codes = Codes(compression.type, compression.threshold, {k: len(v) for k, v in batch})
    else:
        small = [(k, v) for k, v in batch if v.nbytes < PACK_BELOW]
        if any(v.dtype != meta[k][1] for k, v in small):
            dtypes = [v.dtype.str for _, v in small]
    values = pack_values([v for _, v in batch], np.array if copy else _same)
    borrowed = not copy and codes is None and same_process
    keys = [k for k, _ in batch]
    header = PushHeader(*header, keys, dtypes, values.big, borrowed, codes, step, rows)
    return Push(header, values.packed, values.bigs)


def kept_copy(msg: Push) -> Push:
    """``msg`` with its own copies of the big arrays it lends (its packed
    buffer is already its own), to be kept for a resend."""
    return msg._replace(bigs=[np.array(b) for b in msg.bigs])


def kept_push(items: list) -> list[tuple[Any, list[Any]]]:
    """Host copies of a push's values, kept to recognise its retry (:func:`same_push`):
    a dense value's bits, a row-sparse value's rows and their data
    (:func:`labkv.cluster._rows.rank.kept_rows`)."""
    return [
        (k, [kept_rows(v) if is_row_sparse(v) else host(v).copy() for v in vs]) for k, vs in items
    ]


def same_push(kept: list[tuple[Any, list[Any]]], items: list) -> bool:
    """Whether ``items`` push exactly the values ``kept`` (keys, order, bits; a
    row-sparse value: its shape, rows and their bits).

    >>> one = np.ones(2, np.float32)
    >>> same_push([("w", [one.copy()])], [("w", [one])]), same_push([("w", [one])], [("w", [one * 2])])
    (True, False)
    """
    if [k for k, _ in kept] != [k for k, _ in items]:
        return False
    for (_, old), (_, new) in zip(kept, items, strict=True):
        if len(old) != len(new):
            return False
        for a, b in zip(old, new, strict=True):
            if is_row_sparse(a) or is_row_sparse(b):
                if not same_rows(a, b):
                    return False
                continue
            b = host(b)
            if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(a, b):
                return False
    return True


def fill_outs(items: list, got: dict[tuple[int, Any], Any], meta: Meta, pieces: Pieces) -> None:
    """Copy each key's pieces ``got[(server, key)]`` into its outs: straight into
    a C-contiguous numpy out slice by slice, else through the joined value."""
    for key, outs in items:
        placed = pieces[key]
        if len(placed) == 1:
            value = got[(placed[0].server, key)]
            for out in outs:
                _write(out, value)
            continue
        whole = None
        for out in outs:
            if type(out) is np.ndarray and out.flags.c_contiguous:
                flat = out.reshape(-1)  # a view: the slices go straight into out
                for p in placed:
                    piece = np.reshape(got[(p.server, key)], -1)  # a row-sparse key's: rows
                    np.copyto(flat[p.start : p.stop], piece, casting="unsafe")
                continue
            if whole is None:
                whole = join([got[(p.server, key)] for p in placed], *meta[key])
            _write(out, whole)


def _write(out: Any, value: np.ndarray) -> None:
    """``value`` into ``out``; a row-sparse ``out`` holds its non-zero rows."""
    if is_row_sparse(out):
        out[:] = value.reshape(out.shape)
    else:
        copy_into(out, value)


def gather_states(gathered: list, meta: Meta, pieces: Pieces) -> tuple[int, dict, dict]:
    """The store's optimizer states from each server's :class:`~labkv.cluster._protocol.messages.States`:
    ``(num_update, counts, {key: whole state arrays})``."""
    counts: dict[Any, int] = {}
    for got in gathered:
        for k, c in got.counts.items():
            counts[k] = max(c, counts.get(k, 0))
    states: dict[Any, tuple] = {}
    for key, placed in pieces.items():
        parts = [gathered[p.server].states.get(key) for p in placed]
        if any(part is None for part in parts):
            continue
        shape = meta[key][0]
        states[key] = tuple(join([part[j] for part in parts], shape) for j in range(len(parts[0])))
    return max(g.num_update for g in gathered), counts, states


def split_states(
    counts: dict, states: dict, pieces: Pieces, num_servers: int
) -> list[tuple[dict, dict]]:
    """Per server, ``(counts, states)`` of the pieces it holds."""
    server_counts: list[dict] = [{} for _ in range(num_servers)]
    server_states: list[dict] = [{} for _ in range(num_servers)]
    for key, count in counts.items():
        for p in pieces[key]:
            server_counts[p.server][key] = count
    for key, state in states.items():
        parts = [dict(split(np.asarray(a), pieces[key])) for a in state]
        for p in pieces[key]:
            server_states[p.server][key] = tuple(part[p.server] for part in parts)
    return list(zip(server_counts, server_states, strict=True))


def check_same_init(found: dict, items: list, ids: dict) -> None:
    """Refuse a rank's init of a key that rank 0 initialised differently
    (``found``: the servers' ``{key: KeyMeta}``; ``ids``: this rank's id of
    each key, see :mod:`._placement`).

    >>> from labkv.cluster._protocol.messages import KeyMeta
    >>> check_same_init({"b": KeyMeta((2,), "<f8", 1)}, [("b", np.zeros(2))], {"b": 0})
    Traceback (most recent call last):
    ...
    ValueError: key 'b' was initialised by rank 0 with id 1 (its string key number 1), but this rank numbers it 0 (string keys are numbered in init order: initialise them in the same order on every rank)
    """
    for key, array in items:
        if key in found:
            shape, dtype, owner_id = found[key][:3]
            if tuple(shape) != tuple(array.shape) or np.dtype(dtype) != array.dtype:
                raise ValueError(
                    f"key {key!r} was initialised by rank 0 with shape {tuple(shape)} "
                    f"and dtype {np.dtype(dtype)}; this rank gave {tuple(array.shape)} "
                    f"{array.dtype}"
                )
            if owner_id != ids[key]:
                raise ValueError(
                    f"key {key!r} was initialised by rank 0 with id {owner_id} (its string "
                    f"key number {owner_id}), but this rank numbers it {ids[key]} ({ORDER_RULE})"
                )


def pickled_updater(updater: Any) -> bytes:
    """A custom updater as it travels (cloudpickle, as Dask pickles): pickled in
    the caller, so that one that cannot travel is refused at once."""
    try:
        return cloudpickle.dumps(updater)
    except Exception as exc:
        raise TypeError(
            f"the updater cannot be sent to the servers: it cannot be pickled "
            f"({type(exc).__name__}: {exc}); give a function, or an object without "
            "locks, open files or sockets"
        ) from exc


def placement_table(
    pieces: Pieces, meta: Meta, devices: list[str], links: list[Any]
) -> dict[Any, list[dict[str, Any]]]:
    """``kv.placement()``: per key, its pieces ``{'server', 'device', 'start',
    'stop', 'replicas'}``, each server as its link (``links``) reaches it now."""
    return {
        key: [
            {
                "server": p.server,
                "device": f"{devices[p.server] if devices else 'cpu(0)'}@{links[p.server].address}",
                "start": p.start,
                "stop": p.stop,
                "replicas": links[p.server].failover.replicas(),
            }
            for p in pieces[key]
        ]
        for key in meta
    }
