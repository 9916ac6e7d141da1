"""Where keys live: MXNet's placement rule for servers and slices.

A value with fewer elements than ``bigarray_bound`` lives whole on one server,
``(key_id * 9973) % num_servers`` (MXNet's rule; a ``str`` key's id is the
CRC-32 of its UTF-8 bytes, stable across processes and Python runs, unlike
``hash``). A bigger value is cut into ``num_servers`` contiguous slices of its
flattened elements, slice ``s`` on server ``s``, so every server carries a
share of the big tensors' bytes.

>>> place(3, 6, num_servers=2)
[Piece(server=1, start=0, stop=6)]
>>> place("w", 10, num_servers=2, bigarray_bound=8)
[Piece(server=0, start=0, stop=5), Piece(server=1, start=5, stop=10)]
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

Key = int | str

DEFAULT_BIGARRAY_BOUND = 1_000_000


class Piece(NamedTuple):
    """One stored piece of a key: flat elements ``[start, stop)`` on ``server``."""

    server: int
    start: int
    stop: int


def key_id(key: Key) -> int:
    """The integer MXNet's rule hashes: the key itself, or CRC-32 of a str key.

    >>> key_id(7), key_id("w")
    (7, 476252946)
    """
    if isinstance(key, str):
        return zlib.crc32(key.encode("utf-8"))
    return int(key)


def place(
    key: Key, size: int, num_servers: int, bigarray_bound: int = DEFAULT_BIGARRAY_BOUND
) -> list[Piece]:
    """The pieces of a value of ``size`` elements (see module doc).

    >>> place(1, 4, num_servers=3)
    [Piece(server=1, start=0, stop=4)]
    """
    if num_servers < 1:
        raise ValueError(f"need at least one server, got {num_servers}")
    if size < bigarray_bound or num_servers == 1:
        return [Piece((key_id(key) * 9973) % num_servers, 0, size)]
    cuts = [s * size // num_servers for s in range(num_servers + 1)]
    return [Piece(s, cuts[s], cuts[s + 1]) for s in range(num_servers)]
