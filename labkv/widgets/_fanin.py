"""Who holds the dist_sync rounds up, in one line: the ranks missing from the
waiting rounds, most keys first, and how long the oldest has waited. What a
user needs before any grid, at 64 ranks as at 2; the only part of the fan-in
view that changes while a round just waits.

>>> from labkv.events import Event
>>> from labkv.widgets._model import MonitorModel
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

from collections import Counter

from ._model import MonitorModel
from ._tables import fanin_row

__all__ = ["fanin_grid", "fanin_note", "held_up", "missing_ranks"]

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


def fanin_grid(
    model: MonitorModel, rows: int = GRID_ROWS, max_ranks: int = GRID_RANKS
) -> tuple[list[str], list[list[str]], str]:
    """The fan-in grid the dashboard draws: ``(headers, rows, caption)``. The
    keys waiting longest first, at most ``rows`` of them; past ``max_ranks``
    ranks only the columns of ranks missing from a key shown, the others counted
    in one column (a 500 x 64 grid was 34,000 cells and 1.16 MB of HTML, rank 17
    off-screen). ``caption`` says what was left out.

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
    """
    with model.lock:
        rounds = [(key, fan.current()) for key, fan in model.fanin.items()]
    waiting = sum(1 for _, r in rounds if not r["complete"])
    # waiting first, the oldest first; then the others, as they came
    order = sorted(
        range(len(rounds)),
        key=lambda i: (
            (rounds[i][1]["complete"], rounds[i][1]["time"] - rounds[i][1]["waited_s"])
            if not rounds[i][1]["complete"]
            else (True, i)
        ),
    )
    shown = [rounds[i] for i in order[:rows]]
    workers = max((r["num_workers"] for _, r in rounds), default=0)
    folded = workers > max_ranks
    if folded:
        columns = sorted(set().union(*(r["missing"] for _, r in shown)))
    else:
        columns = list(range(workers))
    headers = ["key", "round", "waited", "state"] + [f"rank {i}" for i in columns]
    if folded:
        headers.append("other ranks")
    table = []
    for key, r in shown:
        row = fanin_row(key, r, columns)
        if folded:
            listed = set(columns)
            others = [rank for rank in range(workers) if rank not in listed]
            done = others if r["complete"] else [k for k in others if k in r["pushed"]]
            row.append(
                f"{len(done)} pushed"
                if len(done) == len(others)
                else f"{len(done)} of {len(others)} pushed"
            )
        table.append(row)
    notes = []
    if len(rounds) > len(shown):
        notes.append(f"{len(shown)} of {len(rounds)} keys shown, the {waiting} waiting first")
    if folded:
        notes.append("ranks that pushed every key shown: in one column")
    return headers, table, "; ".join(notes)
