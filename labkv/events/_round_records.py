"""A server's record of many keys' dist_sync rounds, as columns.

A watched server sends the rounds that changed since its last flush as one
``round`` event (``key`` None) whose ``extra["round_columns"]`` is six lists:
the keys, each round's number, the ranks that pushed and those missing (each
set of ranks one int, bit ``r`` for rank ``r``), the seconds the round has
waited, and whether it completed. At 64 ranks and 500 keys a row of lists per
key made 1,500 lists a flush for the notebook to unpickle and its collector to
track (most of a watched notebook's objects); ints are not tracked.

>>> record = RoundColumns()
>>> record.add("w", 3, [0, 2], [1], 0.5, False)
>>> record.add("b", 2, [0, 1, 2], [], 0.1, True)
>>> cols = record.columns()
>>> cols[2], cols[3]
([5, 7], [2, 0])
>>> [(key, number, mask_ranks(missing)) for key, number, _, missing, _, _ in zip(*cols)]
[('w', 3, [1]), ('b', 2, [])]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._types import Key

__all__ = ["RoundColumns", "mask_ranks", "ranks_mask"]

_BIT = (1).__lshift__


def ranks_mask(ranks: Iterable[int]) -> int:
    """The ranks as one int, bit ``r`` set for rank ``r``.

    >>> ranks_mask([0, 2]), ranks_mask([])
    (5, 0)
    """
    return sum(map(_BIT, ranks))


def mask_ranks(mask: int) -> list[int]:
    """The ranks of :func:`ranks_mask`, in order (a loop over the set bits only).

    >>> mask_ranks(5), mask_ranks(1 << 63)
    ([0, 2], [63])
    """
    ranks = []
    while mask:
        low = mask & -mask
        ranks.append(low.bit_length() - 1)
        mask ^= low
    return ranks


class RoundColumns:
    """The columns of one record, filled a key's round at a time."""

    __slots__ = ("keys", "numbers", "pushed", "missing", "waited", "complete")

    def __init__(self) -> None:
        self.keys: list[Key] = []
        self.numbers: list[int] = []
        self.pushed: list[int] = []
        self.missing: list[int] = []
        self.waited: list[float] = []
        self.complete: list[bool] = []

    def __len__(self) -> int:
        return len(self.keys)

    def add(
        self,
        key: Key,
        number: int,
        pushed: Iterable[int],
        missing: Iterable[int],
        waited: float,
        complete: bool,
    ) -> None:
        self.add_masks(key, number, ranks_mask(pushed), ranks_mask(missing), waited, complete)

    def add_masks(
        self, key: Key, number: int, pushed: int, missing: int, waited: float, complete: bool
    ) -> None:
        """:meth:`add`, the ranks already as masks."""
        self.keys.append(key)
        self.numbers.append(number)
        self.pushed.append(pushed)
        self.missing.append(missing)
        self.waited.append(waited)
        self.complete.append(complete)

    def columns(self) -> list[list[Any]]:
        """``[keys, numbers, pushed, missing, waited_s, complete]``, as they travel."""
        return [self.keys, self.numbers, self.pushed, self.missing, self.waited, self.complete]

    def rows(self) -> list[list[Any]]:
        """One ``[key, round, pushed, missing, waited_s, complete]`` row per key,
        the ranks as lists (what a one-key ``round`` event carries)."""
        return [
            [key, number, mask_ranks(pushed), mask_ranks(missing), waited, complete]
            for key, number, pushed, missing, waited, complete in zip(*self.columns())
        ]
