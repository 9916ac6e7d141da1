"""The messages between a rank and its servers, named, with their encoding.

Both sides build and read messages only through this module: a rank's
:class:`~labkv.cluster._rank.dist_store.DistStore` makes :class:`Push`, :class:`Pull` and
:class:`InitItem`; a :class:`~labkv.cluster._server.actor.Server` reads them and answers with
:class:`Values` (a pull's reply), :class:`KeyMeta` and :class:`States`.

What travels is the plain tuple of each message (:func:`encode`), sealed into
one pickled frame when it holds no big array (:func:`labkv.cluster._protocol.packing.seal`): Dask
serialises a plain tuple element by element, so each big array goes as its
own frame without a copy, which a ``NamedTuple`` (pickled whole) would not
guarantee across Dask versions. :func:`decode_push` and friends turn what
arrives (a named message handed over in-process, a plain tuple, or sealed
bytes) back into the named message, and check its arity, so a message of the
wrong shape fails loudly at the border instead of unpacking into the wrong
fields.

Small values of a message lie in one packed buffer (:mod:`labkv.cluster._protocol.packing`) whose
layout travels nowhere: both sides compute it from each key's piece dtype and
shape, with :func:`piece_specs` on both sides.

>>> import numpy as np
>>> push = Push(PushHeader("s", 0, 3, ["w"], None, [], False, None), pack([np.ones(2)]), [])
>>> got = decode_push(encode(push))  # sealed into one bytes: no big array
>>> got.header.seq, got.header.keys, got.packed.nbytes
(3, ['w'], 16)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from ...compression import wire_nbytes
from .._rows.server import row_lookup, with_rows
from .packing import PACK_BELOW, Spec, pack, seal, unpack_values, unseal


class Codes(NamedTuple):
    """How a compressed push's values are coded: every value is the uint8
    codes (:func:`labkv.compression.to_wire`) of ``devices[key]`` devices."""

    kind: str  # '2bit' or '1bit'
    threshold: float
    devices: dict  # key -> number of per-device rows in its codes


class PushHeader(NamedTuple):
    """What a push says besides its values."""

    sender: str  # the rank's store instance (a uuid): pushes are ordered per sender
    rank: int
    seq: int  # this is the sender's seq-th push to this server
    keys: list  # the keys pushed, in message order
    dtypes: list | None  # the packed values' dtypes when one differs from the stored dtype
    big: list  # positions in keys whose values travel as their own arrays (in ``bigs``)
    borrowed: bool  # the big arrays are the caller's own (a rank on the server's worker)
    codes: Codes | None  # compressed push: how to decode the values
    step: int | None = None  # the index of the rank's step (inside ``kv.steps``)
    rows: dict | None = None  # row-sparse keys: their rows within the piece (see _rows)


class Push(NamedTuple):
    """One push message: ``header``, the small values packed, the big ones."""

    header: PushHeader
    packed: np.ndarray | None
    bigs: list


class Pull(NamedTuple):
    """One pull: the values of ``keys`` after ``sender``'s first ``seq`` pushes
    to this server, with ``pushes`` (sealed :class:`Push` messages the sender
    held back) applied first; inside ``kv.steps``, rank ``rank``'s pull in
    step ``step`` (it reads the values as of that step's start)."""

    sender: str
    seq: int
    keys: list
    rank: int | None
    step: int | None
    rows: dict | None  # keys whose rows alone are read: the rows (or spans), see _rows
    pushes: tuple  # last: a message's last element is what it carries (see packing.seal)


class Values(NamedTuple):
    """The values of a list of keys (a pull's reply): those at positions
    ``big`` in ``bigs`` (in order), the others packed."""

    big: list
    packed: np.ndarray | None
    bigs: list


class InitItem(NamedTuple):
    """One key's piece as ``init`` sends it to a server."""

    key: Any
    piece: np.ndarray
    shape: tuple  # the whole value's shape
    dtype: str
    key_id: int  # the owner's id of the key, which placed it (see _placement)
    sparse: bool = False  # a row-sparse key: its pieces are row ranges (see _rows)


class KeyMeta(NamedTuple):
    """A key's whole shape and dtype, and the id its owner placed it by
    (a rank that learns the key places it the same way), as a server reports it."""

    shape: tuple
    dtype: str
    key_id: int
    sparse: bool = False


class States(NamedTuple):
    """A server's optimizer states: ``num_update``, per-key update counts, per-key
    state arrays (the pieces it holds)."""

    num_update: int
    counts: dict
    states: dict


class Peer(NamedTuple):
    """A server of the store as its peers reach it."""

    address: str  # the Dask worker's address
    actor_key: str


def encode(msg: tuple) -> tuple | bytes:
    """What travels for ``msg``: its plain tuple (nested named parts too),
    sealed into one ``bytes`` when it has no big array (see :func:`labkv.cluster._protocol.packing.seal`)."""
    msg = (tuple(msg.header), msg.packed, msg.bigs) if type(msg) is Push else tuple(msg)
    return seal(msg)


def _fields(cls: type, msg: Any) -> Any:
    """The plain tuple ``msg`` (unsealed), checked to have ``cls``'s arity."""
    msg = unseal(msg)
    if len(msg) != len(cls._fields):
        raise TypeError(
            f"a {cls.__name__} message has {len(cls._fields)} fields {cls._fields}, "
            f"got {len(msg)}: {msg!r:.200}"
        )
    return msg


def _named(cls: type, msg: Any) -> Any:
    return msg if type(msg) is cls else cls._make(_fields(cls, msg))


def decode_push(msg: Any) -> Push:
    """The :class:`Push` that :func:`encode` made (or the message itself)."""
    if type(msg) is Push:
        return msg
    header, packed, bigs = _fields(Push, msg)
    return Push(_named(PushHeader, header), packed, bigs)


def decode_pull(msg: Any) -> Pull:
    """The :class:`Pull` that :func:`encode` made (or the message itself)."""
    return _named(Pull, msg)


def decode_values(msg: Any) -> Values:
    """The :class:`Values` that :func:`encode` made (or the message itself)."""
    return _named(Values, msg)


# -- piece dtypes and shapes: the packed layout on both sides -----------------------------
Lookup = Callable[[Any], Spec]  # key -> (dtype, piece shape) as stored


def piece_specs(
    keys: Sequence[Any],
    lookup: Lookup,
    dtypes: Sequence[Any] | None = None,
    codes: Codes | None = None,
) -> list[Spec]:
    """``(dtype, shape)`` of each of ``keys``' packed values: the stored piece's
    (``lookup``), with the message's own ``dtypes`` when it gives them, or the
    uint8 codes of a compressed push.

    >>> stored = {"w": (np.dtype("f4"), (2, 3))}
    >>> piece_specs(["w"], stored.get)
    [(dtype('float32'), (2, 3))]
    >>> piece_specs(["w"], stored.get, dtypes=["<f8"])
    [('<f8', (2, 3))]
    >>> piece_specs(["w"], stored.get, codes=Codes("2bit", 0.5, {"w": 2}))
    [(<class 'numpy.uint8'>, (2, 2))]
    """
    if codes is not None:
        specs = []
        for k in keys:
            _, shape = lookup(k)
            size = int(np.prod(shape, dtype=np.int64))
            specs.append((np.uint8, (codes.devices[k], wire_nbytes(codes.kind, size))))
        return specs
    if dtypes is None:
        return [lookup(k) for k in keys]
    return [(d, lookup(k)[1]) for k, d in zip(keys, dtypes, strict=True)]


def push_items(push: Push, lookup: Lookup) -> list[tuple[Any, Any]]:
    """``(key, value)`` of each key of ``push``, in order (views into its packed
    buffer); a compressed push's values are each device's codes, a row-sparse key's
    a :class:`~labkv.sparse.RowSparseArray` of the piece (:mod:`.._rows.server`)."""
    h = push.header
    spec = lookup if not h.rows else row_lookup(lookup, h.rows)
    items = unpack_values(
        h.keys,
        h.big,
        push.packed,
        push.bigs,
        lambda small: piece_specs(small, spec, h.dtypes, h.codes),
    )
    return items if not h.rows else with_rows(items, h.rows, lookup)


def values_items(keys: Sequence[Any], values: Values, lookup: Lookup) -> list[tuple[Any, Any]]:
    """``(key, value)`` of ``keys`` from the :class:`Values` a pull of them returned."""
    return unpack_values(
        list(keys), values.big, values.packed, values.bigs, lambda small: piece_specs(small, lookup)
    )


def pack_values(
    values: Sequence[Any],
    big: Callable[[Any], Any] = lambda v: v,
    small: Callable[[list[Any]], np.ndarray] = pack,
) -> Values:
    """``values`` as :class:`Values`: those of at least ``PACK_BELOW`` bytes as
    ``big(value)`` (their own arrays), the others packed with ``small``.

    >>> v = pack_values([np.zeros(1), np.zeros(1 << 14)])
    >>> v.big, len(v.bigs), v.packed.nbytes
    ([1], 1, 8)
    """
    positions, bigs, smalls = [], [], []
    for i, value in enumerate(values):
        if value.nbytes < PACK_BELOW:
            smalls.append(value)
        else:
            positions.append(i)
            bigs.append(big(value))
    return Values(positions, small(smalls) if smalls else None, bigs)
