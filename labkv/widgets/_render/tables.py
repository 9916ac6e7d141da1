"""The monitor's sections as plain tables of strings: ``(headers, rows)``.

Text and HTML rendering both start here, so what a script prints and what a
notebook shows are the same numbers. Nothing here is escaped: that is the
HTML renderer's job, done once at its one sink. This module holds the keys and
servers tables; the others live with their views (:mod:`._eventlog`,
:mod:`._tracetable`, :mod:`._fanin`, :mod:`._clocks`) and are named here too.

>>> import labkv, numpy as np
>>> kv = labkv.create("local")
>>> m = MonitorModel()
>>> sub = kv.events.subscribe(m.on_event)
>>> kv.init("w", np.zeros(3)); kv.push("w", np.ones(3))
>>> _ = m.flush()
>>> keys_table(m)[1][0][:6]
['w', '3', '1', '0', '0', '24 B']
>>> sub.unsubscribe()
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from .._clocks import clocks_table
from .._eventlog import EventRows, Table, log_row, log_table
from .._fanin import fanin_row, fanin_table
from .._grid import page_of, pages
from .._legend import MARK
from .._model.monitor_model import MonitorModel
from .._model.records import KeyStats
from .._tracetable import reads_as, trace_note, trace_row, trace_table
from .format import fmt_bytes, fmt_key, fmt_num, fmt_placement, fmt_shape, fmt_time

__all__ = [
    "EventRows",
    "clocks_table",
    "fanin_row",
    "fanin_table",
    "fmt_bytes",
    "fmt_key",
    "fmt_num",
    "fmt_shape",
    "fmt_time",
    "keys_page",
    "keys_table",
    "lost_note",
    "log_row",
    "log_table",
    "reads_as",
    "rows_per_call",
    "servers_table",
    "trace_note",
    "trace_row",
    "trace_table",
]

#: the dashboard's keys table shows this many keys a page (500 rows in a 360 px
#: pane showed 9 of them and cost 87 KiB a refresh)
KEY_ROWS = 40


def keys_table(model: MonitorModel, placement: dict[Any, Any] | None = None) -> Table:
    """Per key: counts, bytes, last value summary, last change, placement; with
    row-sparse keys also the rows per push and pull (:func:`rows_per_call`)."""
    with model.lock:
        stats = list(model.keys.values())
        lost = set(model.lost_reports)
    return _key_rows(stats, placement, any(s.sparse for s in stats), lost)


def keys_page(
    model: MonitorModel,
    placement: dict[Any, Any] | None = None,
    page: int = 0,
    size: int = KEY_ROWS,
) -> tuple[list[str], list[list[str]], str, int, int]:
    """The keys table the dashboard draws: ``(headers, rows, caption, page, pages)``.
    Up to ``size`` keys it is :func:`keys_table`; past it ``size`` keys a page,
    the busiest (pushes + pulls + updater calls) first, and the caption sums every
    key's counts and bytes (exact: the page leaves keys out, not calls).

    >>> from labkv.events import Event
    >>> m = MonitorModel()
    >>> for key in range(5):
    ...     for _ in range(key):
    ...         m.on_event(Event(0, 0.0, "s", "push", key, nbytes=8))
    >>> _ = m.flush()
    >>> headers, rows, caption, page, pages = keys_page(m, page=1, size=2)
    >>> [r[0] for r in rows], page, pages
    (['2', '1'], 1, 2)
    >>> caption
    'keys 3-4 of 4, the busiest first; all of them: 10 pushes, 0 pulls, 80 B pushed, 0 B pulled'
    """
    with model.lock:
        stats = list(model.keys.values())
        lost = set(model.lost_reports)
    sparse = any(s.sparse for s in stats)
    if len(stats) <= size:
        return (*_key_rows(stats, placement, sparse, lost), "", 0, 1)
    order = sorted(range(len(stats)), key=lambda i: (-_calls(stats[i]), i))
    page, start, stop = page_of(len(stats), size, page)
    headers, rows = _key_rows([stats[i] for i in order[start:stop]], placement, sparse, lost)
    pushes, pulls = sum(s.pushes for s in stats), sum(s.pulls for s in stats)
    moved = fmt_bytes(sum(s.bytes_in for s in stats)), fmt_bytes(sum(s.bytes_out for s in stats))
    mark = MARK if lost else ""
    caption = (
        f"keys {start + 1}-{stop} of {len(stats)}, the busiest first; all of them: "
        f"{pushes}{mark} pushes, {pulls} pulls, {moved[0]}{mark} pushed, {moved[1]} pulled"
    )
    return headers, rows, caption, page, pages(len(stats), size)


def _calls(s: KeyStats) -> int:
    return s.pushes + s.pulls + s.updates


def _key_rows(
    stats: list[KeyStats],
    placement: dict[Any, Any] | None,
    sparse: bool,
    lost: Collection[Any] = (),
) -> tuple[list[str], list[list[str]]]:
    # bytes "pushed" and "pulled": a server's "bytes in" counts its inits too
    headers = ["key", "shape", "push", "pull", "updater", "pushed", "pulled"]
    headers += ["min", "max", "mean", "norm", "last change", "placement"]
    rows = []
    if sparse:
        headers.append("rows per push / pull")
    for s in stats:
        v = s.value or {}
        change = f"{s.last_op} {fmt_time(s.last_change)}" if s.last_op else "-"
        mark = MARK if lost and _on_lost(s, placement, lost) else ""
        rows.append(
            [
                fmt_key(s.key),
                fmt_shape(s.shape),
                f"{s.pushes}{mark}",
                str(s.pulls),
                f"{s.updates}{mark}",
                fmt_bytes(s.bytes_in) + mark,
                fmt_bytes(s.bytes_out),
                *(fmt_num(v.get(f)) for f in ("min", "max", "mean", "norm")),
                change,
                fmt_placement((placement or {}).get(s.key)),
            ]
        )
        if sparse:
            rows[-1].append(rows_per_call(s))
    return headers, rows


def _on_lost(s: KeyStats, placement: dict[Any, Any] | None, lost: Collection[Any]) -> bool:
    """Whether a server that lost reports in a failover holds (a slice of) the key;
    with no placement known, whether servers hold it at all."""
    pieces = (placement or {}).get(s.key)
    if not pieces:
        return s.on_servers
    return any(p.get("server") in lost for p in pieces)


def lost_note(model: MonitorModel) -> str:
    """What a :data:`~._legend.MARK` after a count means ('' while no failover lost
    reports): the primaries whose last reports were lost with them.

    >>> from labkv.events import Event
    >>> m = MonitorModel()
    >>> m.on_event(Event(0, 0.0, "s", "failover", None, server=0,
    ...     extra={"lost": ["tcp://a:1"], "promoted": True}))
    >>> _ = m.flush(); lost_note(m)
    "push, updater, pushed marked +: at least this many; reports of the last calls were lost with server 0's primary tcp://a:1 (failed over)"
    """
    with model.lock:
        lost = sorted(model.lost_reports.items(), key=lambda item: str(item[0]))
    if not lost:
        return ""
    where = " and ".join(f"server {sid}'s primary {', '.join(names)}" for sid, names in lost)
    return (
        f"push, updater, pushed marked {MARK}: at least this many; "
        f"reports of the last calls were lost with {where} (failed over)"
    )


def rows_per_call(s: KeyStats) -> str:
    """A row-sparse key's rows moved per push and per pull, on average (``-`` for
    a dense key): what a push or ``row_sparse_pull`` of an embedding table costs.

    >>> rows_per_call(KeyStats("e", pushes=4, pulls=2, rows_in=40, rows_out=30, sparse=True))
    '10 / 15'
    """
    if not s.sparse:
        return "-"
    push = fmt_num(s.rows_in / s.pushes) if s.pushes else "-"
    pull = fmt_num(s.rows_out / s.pulls) if s.pulls else "-"
    return f"{push} / {pull}"


def servers_table(model: MonitorModel) -> Table:
    """Per server: its device, cumulative bytes in and out, keys and bytes held;
    for replicated servers also their workers, the primary first and marked."""
    headers = ["server", "device", "bytes in (inits + pushes)", "bytes out", "keys", "bytes held"]
    with model.lock:
        loads = sorted(model.servers.values(), key=lambda s: str(s.server))
    rows = [
        [
            str(s.server),
            s.device or "-",
            fmt_bytes(s.bytes_in),
            fmt_bytes(s.bytes_out),
            "-" if s.keys is None else str(s.keys),
            fmt_bytes(s.bytes_held),
        ]
        for s in loads
    ]
    if any(s.replicas for s in loads):
        headers.append("replicas (primary first)")
        for row, s in zip(rows, loads):
            names = [f"{a} (primary)" if i == 0 else a for i, a in enumerate(s.replicas)]
            row.append(", ".join(names) or "-")
    return headers, rows
