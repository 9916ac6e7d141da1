"""The dist_ssp clocks panel the dashboard draws, sized for many ranks and keys:
the keys whose ranks are furthest apart first, and past 16 ranks a column only
for the slowest ranks and those that waited most, the others in one column.
(At 64 ranks x 500 keys the whole grid was 34,000 cells and 1.5 MB of HTML;
``print(mon)`` still prints all of it.)

>>> from labkv.events import Event
>>> from labkv.widgets._model import MonitorModel
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

from ._model import MonitorModel
from ._tables import fmt_key

__all__ = ["clocks_grid"]

#: keys shown at most, and ranks with a column of their own at most
GRID_ROWS, GRID_RANKS = 20, 16
#: past GRID_RANKS, the ranks that waited most get a column, this many
WAITERS = 3


def clocks_grid(
    model: MonitorModel, rows: int = GRID_ROWS, max_ranks: int = GRID_RANKS
) -> tuple[list[str], list[list[str]], str]:
    """``(headers, rows, caption)`` of the clocks panel (see module doc)."""
    with model.lock:
        keys = [
            (k, list(c.clocks), c.staleness, c.slowest(), dict(c.waited), dict(c.last_wait))
            for k, c in model.clocks.items()
        ]
    spread = {k: (max(c) - min(c)) if c else 0 for k, c, *_ in keys}
    shown = sorted(keys, key=lambda k: -spread[k[0]])[:rows] if len(keys) > rows else keys
    workers = max((len(clocks) for _, clocks, *_ in keys), default=0)
    folded = workers > max_ranks
    if folded:
        slow = {r for _, c, _, s, *_ in shown for r in s if len(s) < len(c)}
        waited: dict[int, float] = {}
        for *_, w, _ in shown:
            for r, t in w.items():
                waited[r] = waited.get(r, 0.0) + t
        waiters = sorted((r for r in waited if r not in slow), key=lambda r: -waited[r])
        columns = sorted(slow | set(waiters[:WAITERS]))[:max_ranks]
    else:
        columns = list(range(workers))
    headers = ["key", "staleness", "slowest", "spread"] + [f"rank {i}" for i in columns]
    if folded:
        headers.append("other ranks")
    listed = set(columns)
    table = []
    for key, clocks, staleness, slowest, waited_s, last in shown:
        cells = []
        for rank in columns:
            cell = str(clocks[rank] if rank < len(clocks) else 0)
            if rank in waited_s:
                cell += f" · waited {waited_s[rank]:.2f} s (last {last[rank]:.2f} s)"
            if rank in slowest and len(slowest) < len(clocks):
                cell += " SLOWEST"
            cells.append(cell)
        if folded:
            others = [r for r in range(len(clocks)) if r not in listed]
            low, high = min(clocks[r] for r in others), max(clocks[r] for r in others)
            at = f"at clock {low}" if low == high else f"at clocks {low}..{high}"
            total = sum(waited_s.get(r, 0.0) for r in others)
            cells.append(f"{len(others)} {at}, waited {total:.2f} s")
        named = ", ".join(f"rank {r}" for r in slowest) if len(slowest) < len(clocks) else "-"
        table.append([fmt_key(key), str(staleness), named, str(spread[key]), *cells])
    notes = []
    if len(keys) > len(shown):
        notes.append(f"{len(shown)} of {len(keys)} keys shown, the ranks furthest apart first")
    if folded:
        notes.append("ranks that were not the slowest and waited least: in one column")
    return headers, table, "; ".join(notes)
