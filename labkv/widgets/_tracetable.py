"""The updater trace's table: each call's merged input, the stored value before
and after, and what the update did to the mean, as code.

>>> from labkv.events import Event
>>> m = MonitorModel()
>>> m.on_event(Event(0, 0.0, "s", "update", 3, summary={"min": 1.0, "max": 1.0, "mean": 1.0,
...     "norm": 2.4}, before={"min": 4.0, "max": 4.0, "mean": 4.0, "norm": 9.8},
...     after={"min": 6.0, "max": 6.0, "mean": 6.0, "norm": 14.7}))
>>> _ = m.flush()
>>> trace_table(m)[1][0][-1]
'stored += input * 2'
"""

from __future__ import annotations

import math

from ..events import Event
from ._eventlog import EventRows, Table
from ._model.monitor_model import MonitorModel
from ._render.format import fmt_key, fmt_summary, fmt_time

__all__ = ["reads_as", "trace_note", "trace_row", "trace_table"]


def reads_as(e: Event) -> str:
    """What the update did to the mean, as code: ``stored += input * 2``."""
    try:
        delta = e.after["mean"] - e.before["mean"]  # type: ignore[index]
        k = delta / e.summary["mean"]  # type: ignore[index]
    except (TypeError, KeyError, ZeroDivisionError):
        return "-"
    if not math.isfinite(k):
        return "-"
    return f"stored += input * {k:.4g}"


def trace_table(model: MonitorModel, limit: int = 20, cache: EventRows | None = None) -> Table:
    """Updater and optimizer calls, newest first (by time): merged input, stored
    before -> after;
    ``cache``: an :class:`EventRows` of :func:`trace_row` that a live view keeps."""
    headers = ["time", "key", "op", "input mean (min..max)", "stored before", "stored after"]
    headers += ["on the mean"]
    with model.lock:
        events = sorted(reversed(model.trace), key=lambda e: e.time, reverse=True)[:limit]
    return headers, (cache or EventRows(trace_row)).rows(events)


def trace_note(model: MonitorModel, shown: int) -> str:
    """How many of the updater calls a trace of ``shown`` rows shows: under load
    most calls are only counted, and the rows are a sample.

    >>> trace_note(MonitorModel(), 0)
    'no calls'
    """
    with model.lock:
        total = sum(s.updates for s in model.keys.values())
    if not total:
        return "no calls"
    if shown >= total:
        return f"all {total} calls shown"
    return f"{shown} of {total} calls shown; the others were counted, not sampled"


def trace_row(e: Event) -> list[str]:
    """One updater call's row of :func:`trace_table`."""
    return [
        fmt_time(e.time),
        fmt_key(e.key),
        e.op if e.op == "update" else f"{e.op} {e.extra.get('optimizer', '')}".strip(),
        fmt_summary(e.summary),
        fmt_summary(e.before),
        fmt_summary(e.after),
        reads_as(e),
    ]
