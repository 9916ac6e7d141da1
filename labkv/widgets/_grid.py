"""Keys x ranks grids with a column per rank up to a size, and past it a column
only for the ranks that matter (the missing, the slowest), the others in one:
what the fan-in grid and the clocks panel share. Also their paging.

>>> items = [("a", {0, 2}), ("b", {0, 1, 2})]
>>> headers, rows, folded = fold_ranks(
...     ["key"], items, 3, 2,
...     wanted=lambda shown: [r for _, done in shown for r in range(3) if r not in done],
...     cells=lambda item, ranks: [item[0], *("ok" if r in item[1] else "-" for r in ranks)],
...     rest=lambda item, others: f"{sum(r in item[1] for r in others)} ok")
>>> headers, rows
(['key', 'rank 1', 'other ranks'], [['a', '-', '2 ok'], ['b', 'ok', '2 ok']])
>>> page_of(45, 20, 9), page_of(45, 20, 1)
((2, 40, 45), (1, 20, 40))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = ["fold_ranks", "page_of", "pages"]

T = TypeVar("T")


def fold_ranks(
    lead: list[str],
    items: list[T],
    workers: int,
    max_ranks: float,
    wanted: Callable[[list[T]], Iterable[int]],
    cells: Callable[[T, list[int]], list[str]],
    rest: Callable[[T, list[int]], str],
) -> tuple[list[str], list[list[str]], bool]:
    """``(headers, rows, folded)`` of a grid of ``items`` over ``workers`` ranks:
    up to ``max_ranks`` ranks a column each; past it (``folded``) a column only
    for the ranks ``wanted(items)`` names (at most ``max_ranks``), and one more,
    ``other ranks``, of ``rest(item, others)``. ``cells(item, ranks)`` is an
    item's row up to its rank columns, those included."""
    folded = workers > max_ranks
    columns = sorted(set(wanted(items)))[: int(max_ranks)] if folded else list(range(workers))
    headers = lead + [f"rank {r}" for r in columns]
    listed = set(columns)
    others = [r for r in range(workers) if r not in listed]
    rows = []
    for item in items:
        row = cells(item, columns)
        if folded:
            row.append(rest(item, others))
        rows.append(row)
    if folded:
        headers.append("other ranks")
    return headers, rows, folded


def pages(total: int, size: int) -> int:
    """How many pages of ``size`` rows ``total`` rows make (at least one).

    >>> pages(0, 20), pages(40, 20), pages(41, 20)
    (1, 2, 3)
    """
    return max(1, math.ceil(total / max(size, 1)))


def page_of(total: int, size: int, page: int) -> tuple[int, int, int]:
    """``(page, start, stop)``: ``page`` kept within the pages of ``total`` rows,
    and the rows it shows."""
    page = min(max(page, 0), pages(total, size) - 1)
    return page, page * size, min(total, (page + 1) * size)
