"""The dist_ssp clocks panel, sized for many ranks and keys: the keys whose ranks
are furthest apart first, and past 16 ranks a column only for the slowest ranks
and those that waited most, the others in one column. (At 64 ranks x 500 keys
the whole grid was 34,000 cells and 1.5 MB of HTML; ``print(mon)`` still prints
all of it, :func:`clocks_table`.)

>>> from labkv.events import Event
>>> from labkv.widgets._model.monitor_model import MonitorModel
>>> m = MonitorModel()
>>> clocks = [9] * 64
>>> clocks[17] = 4
>>> m.on_event(Event(0, 0.0, "s", "clock", "w", rank=0, extra={"clocks": clocks,
...     "staleness": 5, "waited_s": 0.5}))
>>> _ = m.flush()
>>> headers, rows, caption = clocks_grid(m)
>>> headers[4:], rows[0][4:]
(['rank 0', 'rank 17', 'other ranks'], ['9 · waited 0.50 s (last 0.50 s)', '4 SLOWEST', '62 at clock 9, waited 0.00 s'])
>>> caption
'ranks that were not the slowest and waited least: in one column'
"""

from __future__ import annotations

import math
from typing import Any

from ._grid import fold_ranks
from ._model.monitor_model import MonitorModel
from ._render.format import fmt_key

__all__ = ["clocks_grid", "clocks_table"]

#: keys shown at most, and ranks with a column of their own at most
GRID_ROWS, GRID_RANKS = 20, 16
#: past GRID_RANKS, the ranks that waited most get a column, this many
WAITERS = 3

#: one key's clocks: key, clocks, staleness, slowest ranks, waited per rank, last wait
_Key = tuple[Any, list[int], int, list[int], dict[int, float], dict[int, float]]


def clocks_table(model: MonitorModel) -> tuple[list[str], list[list[str]]]:
    """Keys x ranks of dist_ssp clocks, every key and rank: each rank's clock and
    how long its pulls waited (in total, and the last one); the slowest rank
    named, and marked.

    >>> from labkv.events import Event
    >>> m = MonitorModel()
    >>> m.on_event(Event(0, 0.0, "s", "clock", "w", rank=0, extra={"clocks": [5, 2],
    ...     "staleness": 3, "waited_s": 0.5}))
    >>> _ = m.flush()
    >>> clocks_table(m)
    (['key', 'staleness', 'slowest', 'spread', 'rank 0', 'rank 1'], [['w', '3', 'rank 1', '3', '5 · waited 0.50 s (last 0.50 s)', '2 SLOWEST']])
    """
    headers, rows, _ = _grid(_keys(model), math.inf)
    return headers, rows


def clocks_grid(
    model: MonitorModel, rows: int = GRID_ROWS, max_ranks: int = GRID_RANKS
) -> tuple[list[str], list[list[str]], str]:
    """``(headers, rows, caption)`` of the clocks panel (see module doc)."""
    keys = _keys(model)
    shown = sorted(keys, key=lambda k: -_spread(k[1]))[:rows] if len(keys) > rows else keys
    headers, table, folded = _grid(shown, max_ranks)
    notes = []
    if len(keys) > len(shown):
        notes.append(f"{len(shown)} of {len(keys)} keys shown, the ranks furthest apart first")
    if folded:
        notes.append("ranks that were not the slowest and waited least: in one column")
    return headers, table, "; ".join(notes)


def _keys(model: MonitorModel) -> list[_Key]:
    with model.lock:
        return [
            (k, list(c.clocks), c.staleness, c.slowest(), dict(c.waited), dict(c.last_wait))
            for k, c in model.clocks.items()
        ]


def _spread(clocks: list[int]) -> int:
    return max(clocks) - min(clocks) if clocks else 0


def _wanted(shown: list[_Key]) -> list[int]:
    """The ranks of a folded panel's columns: the slowest, then those that waited most."""
    slow = {r for _, c, _, s, *_ in shown for r in s if len(s) < len(c)}
    waited: dict[int, float] = {}
    for *_, w, _ in shown:
        for r, t in w.items():
            waited[r] = waited.get(r, 0.0) + t
    waiters = sorted((r for r in waited if r not in slow), key=lambda r: -waited[r])
    return sorted(slow | set(waiters[:WAITERS]))


def _cells(item: _Key, ranks: list[int]) -> list[str]:
    key, clocks, staleness, slowest, waited, last = item
    cells = []
    for rank in ranks:
        cell = str(clocks[rank] if rank < len(clocks) else 0)
        if rank in waited:
            cell += f" · waited {waited[rank]:.2f} s (last {last[rank]:.2f} s)"
        if rank in slowest and len(slowest) < len(clocks):
            cell += " SLOWEST"
        cells.append(cell)
    named = ", ".join(f"rank {r}" for r in slowest) if len(slowest) < len(clocks) else "-"
    return [fmt_key(key), str(staleness), named, str(_spread(clocks)), *cells]


def _rest(item: _Key, others: list[int]) -> str:
    """The ``other ranks`` cell: their clocks and how long they waited in all."""
    _, clocks, _, _, waited, _ = item
    theirs = [clocks[r] for r in others if r < len(clocks)]
    if not theirs:
        return "-"
    low, high = min(theirs), max(theirs)
    at = f"at clock {low}" if low == high else f"at clocks {low}..{high}"
    total = sum(waited.get(r, 0.0) for r in others)
    return f"{len(theirs)} {at}, waited {total:.2f} s"


def _grid(keys: list[_Key], max_ranks: float) -> tuple[list[str], list[list[str]], bool]:
    workers = max((len(clocks) for _, clocks, *_ in keys), default=0)
    lead = ["key", "staleness", "slowest", "spread"]
    return fold_ranks(lead, keys, workers, max_ranks, _wanted, _cells, _rest)
