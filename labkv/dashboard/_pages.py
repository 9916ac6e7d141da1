"""The ``individual-labkv-*`` Bokeh pages the scheduler serves.

Each page is a doc function ``(scheduler, extra, doc)`` as Dask's dashboard
calls them (``distributed.dashboard.scheduler.applications``). A page holds no
state of its own beyond what it last drew: every 500 ms it asks the scheduler's
:class:`~._plugin.LabkvDashboard` for the chosen store's rendering
(:meth:`~._plugin.Board.render`, made once per change and shared by every
viewer) and changes its document only when that differs from what it shows.
A closed tab's session ends with its callbacks (Dask's Bokeh server checks
for unused sessions every 500 ms).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..widgets._fanin import fanin_grid, fanin_note
from ..widgets._legend import calls_line, events_by_op
from ..widgets._render.format import fmt_bytes
from ..widgets._render.html import STYLE, esc, table_html
from ..widgets._render.tables import keys_page, lost_note, servers_table
from ..widgets._timeline import COLUMNS, fold_tracks, timeline_view
from ._plugin import NAME, Board

__all__ = ["INTERVAL_MS", "PAGES", "TIMELINE_S"]

#: how often a page looks for news (and the most the plugin folds: twice a second)
INTERVAL_MS = 500
#: seconds of events the timeline page shows
TIMELINE_S = 5.0

NOT_INSTALLED = (
    "labkv's dashboard plugin is not on this scheduler: start it with "
    "`dask scheduler --preload labkv.dashboard` (or Dask config "
    "distributed.scheduler.preload: [labkv.dashboard])"
)
NO_STORE = (
    "no labkv store streams its events here yet: in the notebook, "
    "labkv.dashboard.watch(kv) (or show labkv.widgets.monitor(kv)) for a cluster store"
)
_PAGE_STYLE = STYLE + "<style>.labkv-note { font: 13px sans-serif; margin: 4px 0; }</style>"


def _header(board: Board) -> str:
    """Which store, its type, ranks, servers and replicas, and its calls."""
    info, model = board.info, board.model
    parts = [f"<b>labkv</b> {esc(board.store_id)}"]
    if info:
        parts.append(
            f"type {esc(info.get('type'))} · ranks {esc(info.get('num_workers'))} · "
            f"servers {esc(info.get('num_servers'))} · replicas {esc(info.get('replicas', 1))}"
        )
    with model.lock:
        keys, events = len(model.keys), model.events_seen
    parts.append(f"{esc(calls_line(model))} · {keys} keys · {events} events")
    by_op = events_by_op(model)
    line = " · ".join(parts)
    if by_op:
        line += f'<div class="labkv-legend">events per op: {esc(by_op)}</div>'
    return f'<div class="labkv-header labkv-note">{line}</div>'


def _note(text: str, css: str = "labkv-note") -> str:
    return f'<div class="{esc(css)}">{esc(text)}</div>' if text else ""


def rounds_html(board: Board) -> str:
    """Who holds the dist_sync rounds up (one line), over each key's round per rank."""
    model = board.model
    headers, rows, caption = fanin_grid(model)
    line = fanin_note(model, time.time()) or "no dist_sync round reported yet"
    return (
        _header(board)
        + _note(line, "labkv-fanin-note labkv-note")
        + table_html(headers, rows, "labkv-fanin", "no rounds yet")
        + _note(caption)
    )


def servers_html(board: Board) -> str:
    """Per server: device, bytes in and out, keys and bytes held, replicas."""
    headers, rows = servers_table(board.model)
    placement = board.info.get("placement") or {}
    per_server: dict[Any, int] = {}
    for pieces in placement.values():
        for piece in pieces:
            sid = piece.get("server")
            per_server[sid] = per_server.get(sid, 0) + 1
    note = ""
    if per_server and not rows:
        held = ", ".join(f"server {s}: {n} keys" for s, n in sorted(per_server.items()))
        note = f"as placed when watching began: {held}"
    return (
        _header(board)
        + table_html(headers, rows, "labkv-servers", "no server has reported yet")
        + _note(note)
        + _note(lost_note(board.model))
    )


def keys_html(board: Board) -> str:
    """The 40 busiest keys: calls, bytes, value summary, last change, placement."""
    headers, rows, caption, _, _ = keys_page(board.model, board.info.get("placement"))
    # The value columns: a notebook's monitor reads a key's value from its servers
    # after they change it; the scheduler cannot, so it shows no stale one.
    drop = {headers.index(h) for h in ("min", "max", "mean", "norm")}
    headers = [h for i, h in enumerate(headers) if i not in drop]
    rows = [[c for i, c in enumerate(row) if i not in drop] for row in rows]
    total = sum(s.bytes_in for s in list(board.model.keys.values()))
    return (
        _header(board)
        + table_html(headers, rows, "labkv-keys", "no key seen yet")
        + _note(caption or f"{len(rows)} keys, {fmt_bytes(total)} pushed in all")
    )


def timeline_data(board: Board) -> tuple[str, list[str], dict[str, list]]:
    """``(title, tracks, bars)`` of the last :data:`TIMELINE_S` seconds."""
    model = board.model
    tracks, bars, total = timeline_view(model, None, TIMELINE_S)
    shown, bars = fold_tracks(tracks, bars)
    waits = sum(1 for op in bars["op"] if op in ("clock", "round"))
    spans = f"{total} spans" if total == len(bars["op"]) else f"{len(bars['op'])} of {total} spans"
    title = f"{board.store_id}: last {TIMELINE_S:g} s, {spans}, {waits} waits (red)"
    return title, list(reversed(shown)), bars


def _stores(plugin: Any) -> list[tuple[str, str]]:
    return [
        (sid, f"{sid} ({b.info.get('type', '?')})" if b.info else sid)
        for sid, b in reversed(plugin.boards.items())
    ]


def _page(title: str, draw: Callable[[Any, Any, Any], Callable[[], None]]) -> Callable:
    """A doc function: a store chooser, then what ``draw(doc, plugin, chosen)``
    lays out; the function it returns updates the page."""

    def doc_function(scheduler: Any, extra: Any, doc: Any) -> None:
        from bokeh.models import Column, Div, Select

        doc.title = f"labkv: {title}"
        plugin = scheduler.plugins.get(NAME)
        if plugin is None:
            doc.add_root(Div(text=_PAGE_STYLE + _note(NOT_INSTALLED)))
            return
        chooser = Select(title="store", options=[], value="", width=420)
        chosen = {"id": None, "picked": False}

        def picked(_attr: str, _old: Any, new: str) -> None:
            if new and new != chosen["id"]:
                chosen["id"], chosen["picked"] = new, True

        chooser.on_change("value", picked)
        update, body = draw(doc, plugin, chosen)

        def tick() -> None:
            options = _stores(plugin)
            if [o for o, _ in options] != [o for o, _ in chooser.options]:
                chooser.options = options
            ids = [o for o, _ in options]
            if chosen["id"] not in ids or not chosen["picked"]:
                chosen["id"] = plugin.newest()
            if chosen["id"] is not None and chooser.value != chosen["id"]:
                chooser.value = chosen["id"]
            update()

        plugin.viewers += 1

        def gone(_context: Any) -> None:
            plugin.viewers -= 1

        doc.on_session_destroyed(gone)
        tick()
        doc.add_periodic_callback(tick, INTERVAL_MS)
        doc.add_root(Column(chooser, *body, sizing_mode="stretch_width"))

    doc_function.__name__ = f"labkv_{title}_doc"
    return doc_function


def _html_page(title: str, render: Callable[[Board], str], stamp: bool = False) -> Callable:
    def draw(doc: Any, plugin: Any, chosen: dict) -> tuple[Callable[[], None], list]:
        from bokeh.models import Div

        div = Div(text=_PAGE_STYLE + _note(NO_STORE), sizing_mode="stretch_width")
        div.css_classes = [f"labkv-{title}"]

        def update() -> None:
            board = plugin.boards.get(chosen["id"]) if chosen["id"] else None
            if board is None:
                return
            text = _PAGE_STYLE + board.render(title, render, int(time.time()) if stamp else None)
            if div.text != text:
                div.text = text

        return update, [div]

    return _page(title, draw)


def _timeline_page() -> Callable:
    def draw(doc: Any, plugin: Any, chosen: dict) -> tuple[Callable[[], None], list]:
        import numpy as np
        from bokeh.models import ColumnDataSource, FactorRange
        from bokeh.plotting import figure

        source = ColumnDataSource(data={c: [] for c in COLUMNS})
        fig = figure(
            height=360,
            sizing_mode="stretch_width",
            y_range=FactorRange(factors=[]),
            tools="xpan,xwheel_zoom,reset,save,hover",
            x_axis_label="seconds before the newest event",
            title=NO_STORE,
            tooltips=[("op", "@op"), ("key", "@key"), ("bytes", "@bytes"), ("round", "@round")]
            + [("waited", "@waited_ms ms")],
        )
        fig.hbar(y="track", left="left", right="right", height=0.7, color="color", source=source)
        shown: dict[str, Any] = {"data": None}

        def update() -> None:
            board = plugin.boards.get(chosen["id"]) if chosen["id"] else None
            if board is None:
                return
            data = board.render("timeline", timeline_data)
            if data is shown["data"]:
                return
            shown["data"] = data
            title, tracks, bars = data
            fig.title.text = title
            fig.y_range.factors = tracks
            numeric = ("left", "right", "bytes", "waited_ms")
            source.data = {c: np.asarray(v) if c in numeric else v for c, v in bars.items()}

        return update, [fig]

    return _page("timeline", draw)


#: path -> doc function: what :func:`labkv.dashboard.register_pages` adds
PAGES: dict[str, Callable] = {
    "/individual-labkv-rounds": _html_page("rounds", rounds_html, stamp=True),
    "/individual-labkv-servers": _html_page("servers", servers_html),
    "/individual-labkv-keys": _html_page("keys", keys_html),
    "/individual-labkv-timeline": _timeline_page(),
}
