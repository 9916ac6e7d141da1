"""Where keys live: MXNet's placement rule for servers and slices.

Every key has an integer id: an ``int`` key is its own id; ``str`` keys are
numbered 0, 1, 2, ... in the order a process initialises them (MXNet's
``_str_key_dict``, kept by each worker in its own init order). A value with
fewer elements than ``bigarray_bound`` lives whole on one server, ``(id *
9973) % num_servers`` (MXNet's rule), so a model's keys ``W1, b1, W2, b2``
alternate over two servers. A bigger value is cut into ``num_servers``
contiguous slices of its flattened elements, slice ``s`` on server ``s``
(whatever its id), so every server carries a share of the big tensors' bytes.

>>> place(3, 6, num_servers=2)
[Piece(server=1, start=0, stop=6)]
>>> [place(key_id(k, ["W1", "b1", "W2"]), 6, 2)[0].server for k in ["W1", "b1", "W2"]]
[0, 1, 0]
>>> place(key_id("w", ["w"]), 10, num_servers=2, bigarray_bound=8)
[Piece(server=0, start=0, stop=5), Piece(server=1, start=5, stop=10)]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from .._types import Key

DEFAULT_BIGARRAY_BOUND = 1_000_000

#: What a mismatch of str key ids tells the user to do.
ORDER_RULE = (
    "string keys are numbered in init order: initialise them in the same order on every rank"
)


class Piece(NamedTuple):
    """One stored piece of a key: flat elements ``[start, stop)`` on ``server``."""

    server: int
    start: int
    stop: int


def key_id(key: Key, init_order: Sequence[str] = ()) -> int:
    """The integer MXNet's rule places: an int key itself, or a str key's
    position among the str keys in the order they were initialised.

    >>> key_id(7), key_id("b1", ["W1", "b1", "W2"])
    (7, 1)
    """
    if isinstance(key, str):
        try:
            return list(init_order).index(key)
        except ValueError:
            raise KeyError(f"str key {key!r} is not in the init order given") from None
    return int(key)


def place(
    key_id: int, size: int, num_servers: int, bigarray_bound: int = DEFAULT_BIGARRAY_BOUND
) -> list[Piece]:
    """The pieces of a value of ``size`` elements whose key has id ``key_id``
    (see :func:`key_id` and the module doc).

    >>> place(1, 4, num_servers=3)
    [Piece(server=1, start=0, stop=4)]
    >>> place(5, 10, num_servers=2, bigarray_bound=10)  # sliced: the id plays no part
    [Piece(server=0, start=0, stop=5), Piece(server=1, start=5, stop=10)]
    """
    if isinstance(key_id, str):
        raise TypeError(
            f"place takes a key's integer id, got the str key {key_id!r}: a str key's id "
            "is its position in init order (see key_id)"
        )
    if num_servers < 1:
        raise ValueError(f"need at least one server, got {num_servers}")
    if size < bigarray_bound or num_servers == 1:
        return [Piece((int(key_id) * 9973) % num_servers, 0, size)]
    cuts = [s * size // num_servers for s in range(num_servers + 1)]
    return [Piece(s, cuts[s], cuts[s + 1]) for s in range(num_servers)]


class KeyIds:
    """One process's key ids (see module doc): str keys numbered in the order
    they are :meth:`assign`-ed, or with the id their owner gave them
    (:meth:`adopt`, for a key this process learns without initialising it);
    numbering goes on after the highest id known.

    >>> ids = KeyIds()
    >>> ids.proposed(["W1", "b1"])
    [0, 1]
    >>> ids.assign(["W1", "b1"]); ids.adopt("W3", 4); ids.proposed(["b3"])
    [5]
    >>> ids["b1"], ids[7]
    (1, 7)
    """

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._next = 0

    def __getitem__(self, key: Key) -> int:
        return self._ids[key] if isinstance(key, str) else int(key)

    def proposed(self, keys: Iterable[Key]) -> list[int]:
        """The ids :meth:`assign` would give new ``keys``, without assigning them."""
        ids, n = [], self._next
        for key in keys:
            if isinstance(key, str):
                ids.append(n)
                n += 1
            else:
                ids.append(int(key))
        return ids

    def assign(self, keys: Iterable[Key]) -> None:
        """Number the new str ``keys`` in order (int keys need no number)."""
        for key in keys:
            if isinstance(key, str):
                self.adopt(key, self._next)

    def adopt(self, key: Key, owner_id: int) -> None:
        """Take the id that ``key``'s owner gave it; later keys number after it."""
        if isinstance(key, str):
            self._ids[key] = owner_id
            self._next = max(self._next, owner_id + 1)
