"""Text rendering of the monitor's sections, for scripts, logs and tests.

>>> print(render_table(["key", "push"], [["w", "3"], ["bias", "12"]]))
key   push
----  ----
w     3
bias  12
"""

from __future__ import annotations

import re
import time
from typing import Any

from .._clocks import clocks_table
from .._eventlog import log_table
from .._fanin import fanin_note, fanin_table
from .._legend import calls_line, events_by_op
from .._model.monitor_model import MonitorModel
from .._tracetable import trace_note, trace_table
from .tables import keys_table, lost_note, servers_table

__all__ = ["render_table", "summary", "unread"]


def render_table(headers: list[str], rows: list[list[str]]) -> str:
    """Left-aligned columns separated by two spaces."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def summary(
    model: MonitorModel, placement: dict[Any, Any] | None = None, store: str = "", events: int = 10
) -> str:
    """Every non-empty section of the monitor as text."""
    model.flush()
    counts = events_by_op(model, ", ")
    with model.lock:
        total = model.events_seen
    calls = calls_line(model, ", ")  # as the keys table counts them
    head = f"labkv monitor {store}: {calls}; {total} events" + (f" ({counts})" if counts else "")
    parts = [head]
    trace = trace_table(model, limit=events)
    sections = [
        ("keys", keys_table(model, placement)),
        (f"last {events} events (newest first)", log_table(model, limit=events)),
        (f"updater calls (newest first): {trace_note(model, len(trace[1]))}", trace),
        ("fan-in of the current round", fanin_table(model)),
        ("clocks (dist_ssp)", clocks_table(model)),
        ("server load", servers_table(model)),
    ]
    for title, (headers, rows) in sections:
        if rows and title.startswith("fan-in"):
            title += f": {fanin_note(model, time.time())}"
        if rows:
            parts.append(f"\n{title}\n" + render_table(headers, rows))
        if rows and title == "keys" and lost_note(model):
            parts.append(lost_note(model))
    return "\n".join(parts)


def unread(exc: BaseException) -> str:
    """What a closing monitor could not do, in a few words for its header.

    >>> unread(RuntimeError("server 1 on Dask worker tcp://a:1 is lost (its keys' ...)"))
    'server 1 lost'
    >>> unread(RuntimeError("the store dist_sync-1f is closed (its servers were released)"))
    'store closed'
    >>> unread(KeyError("w"))
    "could not read the store: KeyError('w')"
    """
    text = str(exc)
    lost = _LOST.search(text)
    if lost:
        return f"server {lost[1]} lost"
    if _CLOSED.search(text):
        return "store closed"
    return f"could not read the store: {exc!r}"[:120]


#: the cluster store's messages for a lost server and for a closed store
_LOST = re.compile(r"server (\d+) on Dask worker \S+ is lost")
_CLOSED = re.compile(r"the store \S+ is closed")
