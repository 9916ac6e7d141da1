"""Who holds the dist_sync rounds up, in one line: the ranks missing from the
waiting rounds, most keys first, and how long the oldest has waited. What a
user needs before any grid, at 64 ranks as at 2; the only part of the fan-in
view that changes while a round just waits.

>>> from labkv.events import Event
>>> from labkv.widgets._model.monitor_model import MonitorModel
>>> m = MonitorModel()
>>> for key in ("a", "b"):
...     m.on_event(Event(0, 100.0, "dist_sync", "round", key, server=0, extra={"round": 3,
...         "pushed": [0, 2], "missing": [1], "num_workers": 3, "waited_s": 1.0}))
>>> _ = m.flush()
>>> fanin_note(m, now=102.5)
'2 of 2 keys waiting, the oldest for 3.5 s: rank 1 missing on 2 keys'
>>> held_up(m)
'2 keys wait for rank 1'
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from ._grid import fold_ranks, page_of, pages
from ._model.monitor_model import MonitorModel
from ._render.format import fmt_key, fmt_time

__all__ = [
    "fanin_grid",
    "fanin_note",
    "fanin_row",
    "fanin_table",
    "held_up",
    "missing_ranks",
    "waiting_first",
]

#: ranks named in the line, most keys first (the rest are counted)
NAMED = 4
#: the dashboard's grid: at most this many keys (waiting ones first, the oldest first)
GRID_ROWS = 20
#: ... and a column per rank only up to this many ranks; past it, a column per rank
#: missing from a key shown, the others in one column
GRID_RANKS = 16


def missing_ranks(model: MonitorModel, now: float) -> tuple[int, int, float, Counter[int]]:
    """``(keys, waiting, oldest wait, missing)`` of the dist_sync rounds: keys
    with a round, those waiting, the oldest wait in seconds at ``now``, and per
    rank the number of waiting keys it has not pushed."""
    missing: Counter[int] = Counter()
    oldest, waiting = 0.0, 0
    with model.lock:
        rounds = [fan.current() for fan in model.fanin.values()]
    for r in rounds:
        if r["complete"]:
            continue
        waiting += 1
        oldest = max(oldest, r["waited_s"] + max(0.0, now - r["time"]))
        missing.update(r["missing"])
    return len(rounds), waiting, oldest, missing


def fanin_note(model: MonitorModel, now: float) -> str:
    """One line on the rounds (empty with none): how many keys wait, the oldest's
    wait (whole seconds past 10 s, so the line changes at most once a second),
    and the ranks they wait for, e.g. ``rank 17 missing on 40 keys``."""
    keys, waiting, oldest, missing = missing_ranks(model, now)
    if not keys:
        return ""
    if not waiting:
        return f"every round complete ({keys} keys)"
    wait = f"{oldest:.1f} s" if oldest < 10 else f"{oldest:.0f} s"
    ranks = missing.most_common()
    named = [f"rank {r} missing on {n} key{'s' if n != 1 else ''}" for r, n in ranks[:NAMED]]
    if len(ranks) > NAMED:
        named.append(f"{len(ranks) - NAMED} more ranks missing")
    who = ", ".join(named) or "no rank missing"
    return f"{waiting} of {keys} keys waiting, the oldest for {wait}: {who}"


def held_up(model: MonitorModel) -> str:
    """What the header says of the waiting rounds (empty with none): how many keys
    wait and for which ranks, most keys first; no time, so the header is sent
    again only when the rounds change."""
    _, waiting, _, missing = missing_ranks(model, 0.0)
    if not waiting:
        return ""
    ranks = [str(r) for r, _ in missing.most_common(NAMED)]
    more = f" and {len(missing) - NAMED} more" if len(missing) > NAMED else ""
    who = f"rank{'s' if len(missing) > 1 else ''} {', '.join(ranks)}{more}" if ranks else "?"
    return f"{waiting} key{'s' if waiting != 1 else ''} wait for {who}"


def fanin_table(model: MonitorModel) -> tuple[list[str], list[list[str]]]:
    """Keys x ranks of each key's current ``dist_sync`` round, every key and rank
    (what ``print(mon)`` prints): ``pushed``/``MISSING``. ``waited`` is what a
    finished round took, or when a waiting one began: the grid changes with the
    rounds, not with the clock (:func:`fanin_note` says how long)."""
    with model.lock:
        rounds = [(key, fan.current()) for key, fan in model.fanin.items()]
    headers, rows, _ = _grid(rounds, math.inf)
    return headers, rows


def fanin_row(key: Any, r: dict[str, Any], ranks: Any) -> list[str]:
    """One key's row of the fan-in grid: key, round, waited, state, and the cell
    of each of ``ranks``. ``waited`` is what a finished round took, or when a
    waiting one began."""
    if r["complete"]:
        waited = f"{r['waited_s']:.1f} s"
    else:
        waited = f"since {fmt_time(r['time'] - r['waited_s'])}"
    cells = []
    for rank in ranks:
        if rank in r["pushed"] or r["complete"]:
            cells.append("pushed")
        elif rank in r["missing"]:
            cells.append("MISSING")
        else:
            cells.append("-")
    state = "complete" if r["complete"] else f"waiting for {len(r['missing'])}"
    return [fmt_key(key), str(r["round"]), waited, state, *cells]


def _others(r: dict[str, Any], others: list[int]) -> str:
    """The ``other ranks`` cell of a folded grid: how many of them pushed."""
    done = others if r["complete"] else [k for k in others if k in r["pushed"]]
    if len(done) == len(others):
        return f"{len(done)} pushed"
    return f"{len(done)} of {len(others)} pushed"


def _grid(
    rounds: list[tuple[Any, dict[str, Any]]], max_ranks: float
) -> tuple[list[str], list[list[str]], bool]:
    workers = max((r["num_workers"] for _, r in rounds), default=0)
    return fold_ranks(
        ["key", "round", "waited", "state"],
        rounds,
        workers,
        max_ranks,
        wanted=lambda shown: set().union(*(r["missing"] for _, r in shown)),
        cells=lambda item, ranks: fanin_row(item[0], item[1], ranks),
        rest=lambda item, others: _others(item[1], others),
    )


def waiting_first(model: MonitorModel) -> tuple[list[tuple[Any, dict[str, Any]]], int]:
    """``(rounds, waiting)``: every key's current round (``FanIn.current``), the
    waiting ones first, the oldest first, then the others as they came; and how
    many wait."""
    with model.lock:
        rounds = [(key, fan.current()) for key, fan in model.fanin.items()]
    waiting = sum(1 for _, r in rounds if not r["complete"])
    order = sorted(
        range(len(rounds)),
        key=lambda i: (
            (False, rounds[i][1]["time"] - rounds[i][1]["waited_s"])
            if not rounds[i][1]["complete"]
            else (True, i)
        ),
    )
    return [rounds[i] for i in order], waiting


def fanin_grid(
    model: MonitorModel, rows: int = GRID_ROWS, max_ranks: int = GRID_RANKS, page: int = 0
) -> tuple[list[str], list[list[str]], str]:
    """The fan-in grid the dashboard draws: ``(headers, rows, caption)``. The
    keys waiting longest first, ``rows`` of them a page (``page`` 0 first, kept
    within the pages there are); past ``max_ranks`` ranks only the columns of
    ranks missing from a key shown, the others counted in one column (a 500 x 64
    grid was 34,000 cells and 1.16 MB of HTML, rank 17 off-screen). ``caption``
    says what was left out.

    >>> from labkv.events import Event
    >>> m = MonitorModel()
    >>> for key in range(30):
    ...     pushed = [r for r in range(64) if r != 17 or key % 3]
    ...     m.on_event(Event(0, 100.0 + key, "dist_sync", "round", key, server=0, extra={
    ...         "round": 1, "pushed": pushed, "missing": [17] if key % 3 == 0 else [],
    ...         "num_workers": 64, "waited_s": 0.0, "complete": bool(key % 3)}))
    >>> _ = m.flush()
    >>> headers, rows, caption = fanin_grid(m)
    >>> headers[4:], rows[0][0], rows[0][4:], len(rows)
    (['rank 17', 'other ranks'], '0', ['MISSING', '63 pushed'], 20)
    >>> caption
    '20 of 30 keys shown, the 10 waiting first; ranks that pushed every key shown: in one column'
    >>> headers, rows, caption = fanin_grid(m, page=1)
    >>> [row[0] for row in rows], caption.split(";")[0]
    (['16', '17', '19', '20', '22', '23', '25', '26', '28', '29'], 'keys 21-30 of 30 shown (page 2 of 2), the 10 waiting first')
    """
    rounds, waiting = waiting_first(model)
    page, start, stop = page_of(len(rounds), rows, page)
    shown = rounds[start:stop]
    headers, table, folded = _grid(shown, max_ranks)
    notes = []
    if len(rounds) > len(shown) and page == 0:
        notes.append(f"{len(shown)} of {len(rounds)} keys shown, the {waiting} waiting first")
    elif len(rounds) > len(shown) or page:
        of = f"(page {page + 1} of {pages(len(rounds), rows)})"
        notes.append(
            f"keys {start + 1}-{stop} of {len(rounds)} shown {of}, the {waiting} waiting first"
        )
    if folded:
        notes.append("ranks that pushed every key shown: in one column")
    return headers, table, "; ".join(notes)
