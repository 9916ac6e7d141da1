"""The ipywidgets + bokeh dashboard over a :class:`~labkv.widgets._model.monitor_model.MonitorModel`.

Imported only when a monitor is displayed, so ``import labkv`` never needs
ipywidgets or bokeh. Every widget write happens in :meth:`Dashboard.update`,
called by the monitor's single refresh thread (at most 10 Hz): the event
callback never touches a widget, and all bokeh document changes come from
that one thread. A widget is written only when its rendered value changed,
inside ``hold_sync`` so each changed widget costs one comm message per tick.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import ipywidgets as W
import numpy as np

from ._clocks import clocks_grid
from ._controls import Pager
from ._controls import html_view as _html
from ._controls import pane as _pane
from ._controls import section as _section
from ._controls import set_traits as _set
from ._eventlog import EventRows, log_row, log_view
from ._fanin import GRID_ROWS, fanin_grid, fanin_note, held_up
from ._grid import pages
from ._legend import LEGEND, OPS_LEGEND, calls_line, events_by_op
from ._model.monitor_model import MonitorModel
from ._parts import PARTS
from ._plots import Plots
from ._render.format import fmt_key, fmt_num, fmt_shape
from ._render.html import STYLE, esc, table_html
from ._render.tables import keys_page, lost_note, servers_table
from ._tracetable import trace_note, trace_row, trace_table

__all__ = ["TAB_TITLES", "Dashboard", "ValueState"]

_OPS = [
    "init",
    "push",
    "pull",
    "update",
    "optimizer",
    "round",
    "failover",
    "reseed",
    "rank-lost",
    "rank-replaced",
    "rank-dropped",
]


class ValueState:
    """The chosen key's downsampled value, as the monitor last read it."""

    def __init__(self) -> None:
        self.key: Any = None
        self.picture: np.ndarray | None = None
        self.shape: tuple[int, ...] = ()
        self.dtype = ""
        self.error = ""
        self.version = 0


def _row(children: list[W.Widget]) -> W.HBox:
    """Sections side by side; one that does not fit goes below the others."""
    row = W.HBox(children)
    row.add_class("labkv-row")
    return row


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


#: the dashboard's tabs, in order
TAB_TITLES = ("keys", "value & updates", "servers & rounds", "timeline", "events")
KEYS_TAB, VALUE_TAB, SERVERS_TAB, TIMELINE_TAB, EVENTS_TAB = range(len(TAB_TITLES))
#: the tabs with bokeh plots: drawn only while shown (and in a closed monitor's last picture)
PLOT_TABS = frozenset({VALUE_TAB, SERVERS_TAB, TIMELINE_TAB})


class Dashboard:
    """The widgets of one monitor; :attr:`root` is what a cell displays."""

    def __init__(self, rows: int = 30, trace_rows: int = 8) -> None:
        self.rows = rows
        self.trace_rows = trace_rows
        self.header = _html("labkv-header")
        #: what the header's counts are, under it
        self.legend = W.HTML(esc(LEGEND))
        self.legend.add_class("labkv-legend")
        self.ops_legend = W.HTML(esc(OPS_LEGEND))  # what the log's ops are
        self.ops_legend.add_class("labkv-legend")
        self.keys = _html("labkv-keys-view")
        self.keys_pager, self.fanin_pager = Pager("labkv-keys-pages"), Pager("labkv-fanin-pages")
        self.keys_pages, self.fanin_pages = self.keys_pager.box, self.fanin_pager.box
        # index=0, not value=None: a Dropdown whose value is None shows no selection
        self.key_filter = W.Dropdown(options=[("all keys", None)], index=0, description="key")
        self.op_filter = W.Dropdown(
            options=[("all ops", None)] + [(op, op) for op in _OPS], index=0, description="op"
        )
        self.log = _html("labkv-log-view")
        self.trace = _html("labkv-trace-view")
        self.trace_note = _html("labkv-trace-note")
        self.value_key = W.Dropdown(
            options=[("(first key)", None)], index=0, description="value of"
        )
        self.value_caption = _html("labkv-value-caption")
        self.fanin = _html("labkv-fanin-view")
        self.fanin_note = _html("labkv-fanin-note")
        self.clocks = _html("labkv-clocks-view")
        self.servers = _html("labkv-servers-view")
        self.plots = Plots()
        plots = self.plots
        self._plot_widgets = {
            VALUE_TAB: (plots.value_widget,),
            SERVERS_TAB: (plots.load_widget, plots.heat_widget),
            TIMELINE_TAB: (plots.timeline_widget,),
        }
        for w in (self.key_filter, self.op_filter):
            w.observe(self._filters_changed, names="value")
        self._filters_dirty = True
        #: tabs drawn at every refresh, shown or not: those of the parts shown on their own
        self.kept: set[int] = set()
        self._known_keys: list[Any] = []
        #: (model version, closed) of each tab's last drawing; the header's has the notes too
        self._state: tuple[int, bool, tuple[str, ...]] = (-1, False, ())
        #: (model version, closed) of each tab's last drawing, of its tables and of its plots
        self._drawn_at: dict[tuple[int, str], tuple[int, bool]] = {}
        self._value_version = -1
        self._timeline_key: Any = None
        # While a store is busy every tick redraws its tables, mostly with last tick's
        # rows: these keep the rows made and drawn, so only new ones cost anything.
        self._log_made, self._trace_made = EventRows(log_row), EventRows(trace_row)
        self._drawn: dict[str, dict] = {
            name: {} for name in ("keys", "trace", "servers", "log", "fanin", "clocks")
        }
        # Compact: the one-line header always, the sections as tabs below it, each
        # at most PANE_HEIGHT tall (scrolling inside), so the monitor stays on screen
        # while later cells run.
        self.tabs = W.Tab(
            children=[
                _pane(_section("keys", self.keys_pages, self.keys)),
                _pane(
                    _row(
                        [
                            _section(
                                "value", self.value_key, self.plots.value_widget, self.value_caption
                            ),
                            _section("updater calls (newest first)", self.trace_note, self.trace),
                        ]
                    )
                ),
                _pane(
                    _row(
                        [
                            W.VBox(
                                [
                                    _section(
                                        "fan-in (dist_sync round)",
                                        self.fanin_note,
                                        self.fanin_pages,
                                        self.fanin,
                                        self.plots.heat_widget,
                                    ),
                                    _section("clocks (dist_ssp)", self.clocks),
                                ]
                            ),
                            _section("server load", self.servers, self.plots.load_widget),
                        ]
                    )
                ),
                _pane(
                    _section(
                        "timeline: one row per rank and server (the key chosen for the value)",
                        self.plots.timeline_widget,
                    )
                ),
                _pane(
                    _section(
                        "events (newest first)",
                        W.HBox([self.key_filter, self.op_filter]),
                        self.ops_legend,
                        self.log,
                    )
                ),
            ],
            titles=TAB_TITLES,
        )
        self.root = W.VBox([W.HTML(STYLE), self.header, self.legend, self.tabs])
        self.root.add_class("labkv-monitor")

    def part(self, name: str) -> W.VBox:
        """A new widget showing one of :data:`~labkv.widgets._parts.PARTS` under the
        header: the same widgets as the tab's, so it changes with them; from now on
        that tab is drawn at every refresh, shown or not."""
        part = PARTS[name]
        self.kept.add(TAB_TITLES.index(part.tab))
        widgets = [getattr(self, attr) for attr in part.widgets]
        if name == "events":  # the filters side by side, as in the tab
            widgets = [W.HBox(widgets[:2]), *widgets[2:]]
        view = W.VBox([W.HTML(STYLE), self.header, _pane(_section(part.title, *widgets))])
        view.add_class("labkv-part")
        return view

    def _filters_changed(self, _change: Any) -> None:
        self._filters_dirty = True  # the next tick re-renders the log

    @property
    def tab(self) -> int:
        """The index of the tab the page shows (in :data:`TAB_TITLES`)."""
        index = self.tabs.selected_index
        return 0 if index is None else index

    @property
    def shows_value(self) -> bool:
        """Whether the page shows the value view's tab (the monitor reads the value
        for it only then)."""
        return self.tab == VALUE_TAB

    def update(
        self,
        model: MonitorModel,
        value: ValueState,
        placement: dict[Any, Any],
        title: str,
        closed: bool = False,
        every_tab: bool = False,
        notes: tuple[str, ...] = (),
        hidden_tables: bool = False,
    ) -> None:
        """Re-render what changed since the last call: the header, the tab the page
        shows and the tables of the parts shown on their own (``hidden_tables``:
        the tables of every tab; ``every_tab``: everything, plots too, e.g. for
        the last picture of a closed monitor). A hidden tab's plots are drawn when
        it is shown: BokehJS paints nothing hidden, and drawing them (the timeline
        above all) was most of a busy store's refresh. ``notes`` (what a closed
        monitor could not read at the end, e.g. ``server 1 lost``) go in the header."""
        state = (model.version, closed)
        if (*state, notes) != self._state:
            self._state = (*state, notes)
            self._draw_header(model, title, closed, notes)
        shown = self.tab
        for tab in range(len(TAB_TITLES)):
            visible = tab == shown
            tables = visible or every_tab or hidden_tables or tab in self.kept
            plots = (visible or every_tab) and tab in PLOT_TABS
            redraw = self._drawn_at.get((tab, "tables")) != state
            if tab == EVENTS_TAB and self._filters_dirty:
                redraw = True
            pager = {KEYS_TAB: self.keys_pager, SERVERS_TAB: self.fanin_pager}.get(tab)
            if pager is not None and pager.dirty:  # a page turned: drawn now, shown or not
                redraw = tables = True
            if tables and redraw:
                self._drawn_at[tab, "tables"] = state
                self._draw_tables(tab, model, placement)
            if tab == SERVERS_TAB and (tables or plots):
                self._draw_fanin_note(model)
            if not plots:
                continue
            stale = self._drawn_at.get((tab, "plots")) != state
            self._drawn_at[tab, "plots"] = state
            widgets = self._plot_widgets[tab]
            with contextlib.nullcontext() if visible else self.plots.hidden(widgets):
                self._draw_plots(tab, model, value, stale)
            if visible:
                self.plots.resend(widgets)

    def _draw_tables(self, tab: int, model: MonitorModel, placement: dict[Any, Any]) -> None:
        """The HTML of one tab (its plots are drawn by :meth:`_draw_plots`)."""
        drawn = self._drawn
        if tab == KEYS_TAB:
            self._draw_keys(model, placement)
        elif tab == VALUE_TAB:
            trace = trace_table(model, self.trace_rows, self._trace_made)
            empty = "no updater calls yet"
            _set(self.trace, value=table_html(*trace, "labkv-trace", empty, drawn["trace"]))
            note = trace_note(model, len(trace[1])) if trace[1] else ""
            _set(self.trace_note, value=f'<span class="labkv-empty">{esc(note)}</span>')
        elif tab == SERVERS_TAB:
            headers, rows, caption = clocks_grid(model)  # the ranks furthest apart first
            grid = table_html(headers, rows, "labkv-clocks", "no dist_ssp pulls", drawn["clocks"])
            if caption:
                grid += f'<div class="labkv-empty">{esc(caption)}</div>'
            _set(self.clocks, value=grid)
            servers = servers_table(model)
            empty = "no server events"
            _set(self.servers, value=table_html(*servers, "labkv-servers", empty, drawn["servers"]))
            pager = self.fanin_pager  # the keys waiting longest first, a page of them
            headers, rows, caption = fanin_grid(model, page=pager.page)
            grid = table_html(headers, rows, "labkv-fanin", "no dist_sync rounds", drawn["fanin"])
            if caption:
                grid += f'<div class="labkv-empty">{esc(caption)}</div>'
            _set(self.fanin, value=grid)
            with model.lock:
                keys = len(model.fanin)
            page = min(pager.page, pages(keys, GRID_ROWS) - 1)
            pager.show(page, pages(keys, GRID_ROWS), f"page {page + 1} of {pages(keys, GRID_ROWS)}")
        elif tab == EVENTS_TAB:
            self._draw_log(model)

    def _draw_log(self, model: MonitorModel) -> None:
        self._filters_dirty = False
        *log, caption = log_view(
            model, self.key_filter.value, self.op_filter.value, self.rows, self._log_made
        )
        html = table_html(*log, "labkv-log", "no events yet", self._drawn["log"])
        if caption:  # a busy store's log: grouped by op and place
            html = f'<div class="labkv-empty">{esc(caption)}</div>' + html
        _set(self.log, value=html)

    def _draw_fanin_note(self, model: MonitorModel) -> None:
        """The line above the fan-in grid: who holds the rounds up, and for how long.
        Only this line changes while a round waits; the grid is sent when it changes."""
        note = fanin_note(model, time.time())
        _set(self.fanin_note, value=f'<span class="labkv-fanin-line">{esc(note)}</span>')

    def _draw_plots(self, tab: int, model: MonitorModel, value: ValueState, stale: bool) -> None:
        if tab == VALUE_TAB and value.version != self._value_version:
            self._value_version = value.version
            self._show_value(value)
        elif tab == SERVERS_TAB and stale:
            self.plots.show_load(model)
            self.plots.show_heatmap(model)
        elif tab == TIMELINE_TAB and (stale or self.value_key.value != self._timeline_key):
            self._timeline_key = self.value_key.value
            self.plots.show_timeline(model, self._timeline_key)

    def _draw_header(
        self, model: MonitorModel, title: str, closed: bool, notes: tuple[str, ...] = ()
    ) -> None:
        """The one-line header, and the key choices of the dropdowns."""
        with model.lock:
            keys = list(model.keys)
            total, dropped = model.events_seen, model.dropped_keys
        state = f" ({'; '.join(('closed', *notes))})" if closed else ""
        extra = f" · {dropped} events of untracked keys" if dropped else ""
        # The calls as the keys table counts them; the events (a dist store's push is
        # one on its rank and one on its server) per op in the tooltip.
        events = _count(total, "event")
        by_op = events_by_op(model)
        if by_op:
            events = f'<span class="labkv-events" title="{esc(by_op)}">{events}</span>'
        summary = f"{esc(calls_line(model))} · {_count(len(keys), 'key')}{esc(extra)} · {events}"
        held = held_up(model)  # who holds the dist_sync rounds up, before any grid
        if held:
            summary += f" · {esc(held)}"
        _set(self.header, value=f"<b>labkv monitor</b> {esc(title)}{esc(state)}: {summary}")
        if keys != self._known_keys:
            self._known_keys = keys
            self._set_options(self.key_filter, [("all keys", None)], keys)
            self._set_options(self.value_key, [("(first key)", None)], keys)

    def _draw_keys(self, model: MonitorModel, placement: dict[Any, Any]) -> None:
        pager = self.keys_pager  # past KEY_ROWS keys: a page of them, the busiest first
        *table, caption, page, count = keys_page(model, placement, pager.page)
        html = table_html(*table, "labkv-keys", "no keys yet", self._drawn["keys"])
        note = lost_note(model)  # counts a failover made a lower bound
        if note:
            html += f'<div class="labkv-empty labkv-lost">{esc(note)}</div>'
        _set(self.keys, value=html)
        pager.show(page, count, caption)

    def _show_value(self, value: ValueState) -> None:
        if value.error:
            _set(self.value_caption, value=f"<span>{esc(value.error)}</span>")
            return
        pic = value.picture
        if pic is None:
            return
        shape = fmt_shape(value.shape)
        shown = fmt_shape(pic.shape)
        what = f"key {fmt_key(value.key)}: {shape} {value.dtype}, shown {shown}"
        numbers = (
            f"min {fmt_num(float(np.nanmin(pic)))} max {fmt_num(float(np.nanmax(pic)))} "
            f"mean {fmt_num(float(np.nanmean(pic)))}"
        )
        # the picture first, then its caption: a caption never describes a picture not yet drawn
        self.plots.show_value(pic, f"key {fmt_key(value.key)}")
        # two lines that never wrap: a number alone on a line reads as a value
        _set(
            self.value_caption,
            value=f"<span>{esc(what)}</span> <br><span>{esc(numbers)}</span>",
        )

    @staticmethod
    def _set_options(widget: W.Dropdown, first: list[tuple[str, Any]], keys: list[Any]) -> None:
        current = widget.value
        # Dropdown labels render as text (not HTML), so hostile key names are safe here.
        options = first + [(fmt_key(k), k) for k in keys]
        with widget.hold_sync():
            widget.options = options
            if current in keys:
                widget.value = current
            else:
                widget.index = 0
