"""The keys a server holds: each key's metadata, which keys are cut into slices
(one per server), and which piece stands for a whole push in the events.

>>> table = KeyTable(sid=1)
>>> table.add("w", KeyMeta((4,), "float32", 0), whole=False)
>>> "w" in table, table.sliced, table.first_piece["w"]  # slice 1 of "w": slice 0 stands for it
(True, {'w'}, False)
>>> table.never(["w", 3])
'keys [3] were never initialised (rank 0 has not called init for them)'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..._types import Key
from ...devices import to_device
from ...shard import Shard
from .._placement import ORDER_RULE
from .._protocol.messages import InitItem, KeyMeta


@dataclass
class KeysSnapshot:
    """A :class:`KeyTable` as a new replica takes it."""

    meta: dict[Key, KeyMeta]
    first_piece: dict[Key, bool]
    sliced: set[Key]


class KeyTable:
    """The keys of server ``sid`` (see module doc)."""

    __slots__ = ("sid", "meta", "first_piece", "sliced")

    def __init__(self, sid: int) -> None:
        self.sid = sid
        self.meta: dict[Key, KeyMeta] = {}
        # A whole value, or slice 0 of a sliced one (slice s lives on server s): the
        # piece whose receipt stands for the push, so views count each push once.
        self.first_piece: dict[Key, bool] = {}
        # A sliced key's update commits on every server or none (the servers vote).
        self.sliced: set[Key] = set()

    def __contains__(self, key: object) -> bool:
        return key in self.meta

    def add(self, key: Key, meta: KeyMeta, whole: bool) -> None:
        """A new key; ``whole``: this server holds all of it, not one slice."""
        self.meta[key] = meta
        self.first_piece[key] = self.sid == 0 or whole
        if not whole:
            self.sliced.add(key)

    def have(self, wanted: list[Key]) -> bool:
        return all(k in self.meta for k in wanted)

    def never(self, wanted: list[Key]) -> str:
        """Why a wait for ``wanted`` timed out."""
        missing = [k for k in wanted if k not in self.meta]
        why = f"keys {missing} were never initialised (rank 0 has not called init for them"
        if any(isinstance(k, str) for k in missing):
            # A rank whose order differs places the key elsewhere and waits here in vain.
            why += f", or initialised them in another order, on another server; {ORDER_RULE}"
        return why + ")"

    def snapshot(self) -> KeysSnapshot:
        return KeysSnapshot(dict(self.meta), dict(self.first_piece), set(self.sliced))

    def restore(self, snap: KeysSnapshot) -> None:
        self.meta, self.first_piece = dict(snap.meta), dict(snap.first_piece)
        self.sliced = set(snap.sliced)


def store_new_keys(
    items: list[InitItem], device: Any, shard: Shard, table: KeyTable, rounds: Any
) -> int:
    """Store each new key's piece in ``shard`` (on ``device``), its metadata
    in ``table`` and its round in ``rounds``; the bytes that came in."""
    nbytes = 0
    for item in items:
        key, piece, shape = item.key, item.piece, item.shape
        shard.init(key, to_device(np.asarray(piece, dtype=item.dtype), device))
        whole = piece.size == int(np.prod(shape))
        table.add(key, KeyMeta(tuple(shape), item.dtype, item.key_id, item.sparse), whole)
        rounds.add(key)
        nbytes += piece.nbytes
    return nbytes
