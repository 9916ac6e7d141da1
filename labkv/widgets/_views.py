"""The ipywidgets + bokeh dashboard over a :class:`~labkv.widgets._model.MonitorModel`.

Imported only when a monitor is displayed, so ``import labkv`` never needs
ipywidgets or bokeh. Every widget write happens in :meth:`Dashboard.update`,
called by the monitor's single refresh thread (at most 10 Hz): the event
callback never touches a widget, and all bokeh document changes come from
that one thread. A widget is written only when its rendered value changed,
inside ``hold_sync`` so each changed widget costs one comm message per tick.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import ipywidgets as W
import numpy as np

from ._html import STYLE, esc, table_html
from ._model import MonitorModel
from ._tables import (
    EventRows,
    clocks_table,
    fanin_table,
    fmt_key,
    fmt_num,
    fmt_shape,
    keys_table,
    log_row,
    log_table,
    servers_table,
    trace_note,
    trace_row,
    trace_table,
)
from ._timeline import COLUMNS as TIMELINE_COLUMNS
from ._timeline import timeline_bars

__all__ = ["TAB_TITLES", "Dashboard", "ValueState"]

_OPS = ["init", "push", "pull", "update", "optimizer", "round"]
_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


class ValueState:
    """The chosen key's downsampled value, as the monitor last read it."""

    def __init__(self) -> None:
        self.key: Any = None
        self.picture: np.ndarray | None = None
        self.shape: tuple[int, ...] = ()
        self.dtype = ""
        self.error = ""
        self.version = 0


def _set(widget: W.Widget, **traits: Any) -> bool:
    """Write the traits that differ, as one message; returns whether anything was sent."""
    changed = {k: v for k, v in traits.items() if getattr(widget, k) != v}
    if not changed:
        return False
    with widget.hold_sync():
        for name, value in changed.items():
            setattr(widget, name, value)
    return True


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _html(css: str) -> W.HTML:
    widget = W.HTML()
    widget.add_class(css)
    return widget


def _section(title: str, *children: W.Widget) -> W.VBox:
    # flex none: a wide table beside a section scrolls the pane, never squeezes the plot
    layout = W.Layout(margin="4px 8px", flex="none")
    return W.VBox([W.HTML(f"<b>{esc(title)}</b>"), *children], layout=layout)


#: the dashboard's tabs, in order
TAB_TITLES = ("keys", "value & updates", "servers & rounds", "timeline", "events")
PANE_HEIGHT = "360px"
#: seconds of events the timeline shows, before the newest
TIMELINE_S = 5.0


def _pane(child: W.Widget) -> W.Box:
    return W.Box([child], layout=W.Layout(max_height=PANE_HEIGHT, overflow="auto"))


@functools.cache
def _bokeh_widget_class() -> type:
    from jupyter_bokeh.widgets import BokehModel

    class BokehWidget(BokehModel):
        """``BokehModel`` whose ``close`` may run twice (ours, then ``__del__``'s);
        jupyter_bokeh's raises ``KeyError`` the second time."""

        _labkv_closed = False

        def close(self) -> None:
            if not self._labkv_closed:
                self._labkv_closed = True
                super().close()

    return BokehWidget


def _byte_unit(largest: float) -> tuple[str, int]:
    """The binary unit that shows ``largest`` bytes as a number below 1024.

    >>> _byte_unit(300_000), _byte_unit(10)
    (('KiB', 1024), ('B', 1))
    """
    for power, unit in enumerate(("B", "KiB", "MiB", "GiB")):
        if largest < 1024 ** (power + 1) or unit == "GiB":
            return unit, 1024**power
    return "B", 1  # unreachable


def _color_range(picture: np.ndarray) -> tuple[float, float]:
    """The colour mapper's range: the data's, widened around a constant value so
    that it shows as the middle colour, with its number on the colour bar.

    >>> _color_range(np.full((2, 3), 10.0)), _color_range(np.arange(3.0))
    ((9.0, 11.0), (0.0, 2.0))
    """
    finite = picture[np.isfinite(picture)]
    if not finite.size:
        return 0.0, 1.0
    low, high = float(finite.min()), float(finite.max())
    if low == high:
        pad = abs(low) * 0.1 or 1.0
        return low - pad, high + pad
    return low, high


class _Plots:
    """The bokeh figures (value heatmap/line, server bytes over time), or a note
    when bokeh or jupyter_bokeh is not installed."""

    def __init__(self) -> None:
        self._load_seen: list | None = None
        try:
            from bokeh.models import ColorBar, ColumnDataSource, FactorRange, LinearColorMapper
            from bokeh.palettes import Viridis256
            from bokeh.plotting import figure

            BokehModel = _bokeh_widget_class()
        except ImportError:
            note = "install bokeh and jupyter_bokeh (pip install 'labkv[lab]') for plots"
            self.value_widget = self.load_widget = W.HTML(f"<i>{esc(note)}</i>")
            self.timeline_widget = self.value_widget
            self.available = False
            return
        self.available = True
        self.image_source = ColumnDataSource(
            data={"image": [np.zeros((1, 1))], "dw": [1], "dh": [1]}
        )
        self.line_source = ColumnDataSource(data={"x": [], "y": []})
        fig = figure(height=200, width=400, tools="reset,save", toolbar_location="right")
        fig.x_range.only_visible = fig.y_range.only_visible = True
        self.mapper = LinearColorMapper(palette=Viridis256, low=0, high=1)
        self.image = fig.image(
            "image", x=0, y=0, dw="dw", dh="dh", source=self.image_source, color_mapper=self.mapper
        )
        self.color_bar = ColorBar(color_mapper=self.mapper, width=10, title="value")
        fig.add_layout(self.color_bar, "right")
        self.line = fig.line("x", "y", source=self.line_source, line_width=2)
        self.line.visible = False
        self.value_fig = fig
        self.load_source = ColumnDataSource(data={"xs": [], "ys": [], "color": [], "label": []})
        load = figure(
            height=190,
            width=460,
            tools="reset,save",
            toolbar_location="right",
            x_axis_label="time (s)",
            y_axis_label="bytes",
            title="bytes in and out, cumulative",
        )
        load.multi_line("xs", "ys", color="color", legend_field="label", source=self.load_source)
        load.add_layout(load.legend[0], "right")  # beside the lines, never over them
        self.load_fig = load
        self._timeline_seen: tuple | None = None
        self.timeline_source = ColumnDataSource(data={c: [] for c in TIMELINE_COLUMNS})
        timeline = figure(
            height=260,
            width=720,
            y_range=FactorRange(factors=[]),
            tools="xpan,xwheel_zoom,reset,save,hover",
            toolbar_location="right",
            x_axis_label="seconds before the newest event",
            title="timeline: no events yet",
            tooltips=[("op", "@op"), ("key", "@key"), ("bytes", "@bytes"), ("round", "@round")]
            + [("waited", "@waited_ms ms")],
        )
        timeline.hbar(
            y="track",
            left="left",
            right="right",
            height=0.7,
            color="color",
            source=self.timeline_source,
        )
        self.timeline_fig = timeline
        self.value_widget = BokehModel(fig)
        self.load_widget = BokehModel(load)
        self.timeline_widget = BokehModel(timeline)
        self.load_widget.layout.display = "none"  # until a server reports: no empty box

    def show_value(self, picture: np.ndarray, title: str) -> None:
        if not self.available:
            return
        if picture.ndim == 1:
            self.value_fig.title.text = f"{title}: value by position"
            self.line_source.data = {"x": np.arange(picture.size), "y": picture}
            self.image.visible, self.line.visible = False, True
            self.color_bar.visible = False
        else:
            # the title, not axis labels: BokehJS redraws a changed title, not a label
            self.value_fig.title.text = f"{title}: rows x columns, colour = value"
            rows, cols = picture.shape
            self.mapper.low, self.mapper.high = _color_range(picture)
            self.image_source.data = {"image": [picture], "dw": [cols], "dh": [rows]}
            self.image.visible, self.line.visible = True, False
            self.color_bar.visible = True

    def redraw(self) -> None:
        """Send the plots again. BokehJS lays out and paints a plot only while it is
        visible: one that changed in a hidden tab shows stale parts (old data, no
        colour bar) until it is drawn again, e.g. when its tab is shown."""
        if not self.available:
            return
        sources = (self.image_source, self.line_source, self.load_source, self.timeline_source)
        for source in sources:
            source.data = dict(source.data)
        shown = self.color_bar.visible
        self.color_bar.visible = not shown  # a layout change: the bar is laid out anew
        self.color_bar.visible = shown

    def show_timeline(self, model: MonitorModel, key: Any = None) -> None:
        """The last ``TIMELINE_S`` seconds of spans (of ``key``, or of every key)."""
        if not self.available:
            return
        tracks, bars = timeline_bars(model, key, TIMELINE_S)
        seen = (key, tracks, len(bars["op"]), bars["right"][-1:], bars["left"][:1])
        if seen == self._timeline_seen:
            return
        self._timeline_seen = seen
        what = "every key" if key is None else f"key {fmt_key(key)}"
        waits = sum(1 for op in bars["op"] if op in ("clock", "round"))
        self.timeline_fig.title.text = (
            f"timeline of {what}, last {TIMELINE_S:g} s: {len(bars['op'])} spans, "
            f"{waits} waits (red)"
        )
        self.timeline_fig.y_range.factors = list(reversed(tracks))
        self.timeline_source.data = bars

    def show_load(self, model: MonitorModel) -> None:
        if not self.available:
            return
        with model.lock:
            series = [(s.server, list(s.history)) for s in model.servers.values()]
        # Setting the data sends a document patch even when nothing changed (a local
        # store has no servers at all): only send new points.
        seen = [(server, len(h), h[-1] if h else None) for server, h in series]
        if seen == self._load_seen:
            return
        self._load_seen = seen
        if not any(h for _, h in series):
            return
        self.load_widget.layout.display = None
        t0 = min(h[0][0] for _, h in series if h)
        largest = max(max(b_in, b_out) for _, h in series for _, b_in, b_out in h)
        unit, scale = _byte_unit(largest)
        self.load_fig.title.text = f"bytes in and out, cumulative ({unit})"
        data: dict[str, list] = {"xs": [], "ys": [], "color": [], "label": []}
        for i, (server, history) in enumerate(sorted(series, key=lambda x: str(x[0]))):
            xs = [t - t0 for t, _, _ in history]
            for j, (direction, column) in enumerate((("in", 1), ("out", 2))):
                data["xs"].append(xs)
                data["ys"].append([h[column] / scale for h in history])
                data["color"].append(_PALETTE[(2 * i + j) % len(_PALETTE)])
                data["label"].append(f"server {server} {direction}")
        self.load_source.data = data


class Dashboard:
    """The widgets of one monitor; :attr:`root` is what a cell displays."""

    def __init__(self, rows: int = 30, trace_rows: int = 8) -> None:
        self.rows = rows
        self.trace_rows = trace_rows
        self.header = _html("labkv-header")
        self.keys = _html("labkv-keys-view")
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
        self.clocks = _html("labkv-clocks-view")
        self.servers = _html("labkv-servers-view")
        self.plots = _Plots()
        for w in (self.key_filter, self.op_filter):
            w.observe(self._filters_changed, names="value")
        self._filters_dirty = True
        self._known_keys: list[Any] = []
        self._version = -1
        self._closed = False
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
                _pane(_section("keys", self.keys)),
                _pane(
                    W.HBox(
                        [
                            _section(
                                "value", self.value_key, self.plots.value_widget, self.value_caption
                            ),
                            _section("updater calls (newest first)", self.trace_note, self.trace),
                        ]
                    )
                ),
                _pane(
                    W.HBox(
                        [
                            W.VBox(
                                [
                                    _section("fan-in (dist_sync round)", self.fanin),
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
                        "events (newest first)", W.HBox([self.key_filter, self.op_filter]), self.log
                    )
                ),
            ],
            titles=TAB_TITLES,
        )
        self.root = W.VBox([W.HTML(STYLE), self.header, self.tabs])
        self.root.add_class("labkv-monitor")

    def _filters_changed(self, _change: Any) -> None:
        self._filters_dirty = True  # the next tick re-renders the log

    def update(
        self,
        model: MonitorModel,
        value: ValueState,
        placement: dict[Any, Any],
        title: str,
        closed: bool = False,
    ) -> None:
        """Re-render what changed since the last call."""
        changed = model.version != self._version or closed != self._closed
        self._version, self._closed = model.version, closed
        if changed:
            with model.lock:
                counts = " · ".join(f"{esc(op)} {n}" for op, n in sorted(model.counts.items()))
                keys = list(model.keys)
                total, dropped = model.events_seen, model.dropped_keys
            state = " (closed)" if closed else ""
            extra = f" · {dropped} events of untracked keys" if dropped else ""
            summary = f"{_count(total, 'event')} · {_count(len(keys), 'key')} · {counts}{extra}"
            _set(
                self.header,
                value=f"<b>labkv monitor</b> {esc(title)}{state}: {summary}",
            )
            _set(
                self.keys,
                value=table_html(
                    *keys_table(model, placement), "labkv-keys", "no keys yet", self._drawn["keys"]
                ),
            )
            trace = trace_table(model, self.trace_rows, self._trace_made)
            _set(
                self.trace,
                value=table_html(
                    *trace, "labkv-trace", "no updater calls yet", self._drawn["trace"]
                ),
            )
            note = trace_note(model, len(trace[1])) if trace[1] else ""
            _set(self.trace_note, value=f'<span class="labkv-empty">{esc(note)}</span>')
            clocks = table_html(
                *clocks_table(model), "labkv-clocks", "no dist_ssp pulls", self._drawn["clocks"]
            )
            _set(self.clocks, value=clocks)
            _set(
                self.servers,
                value=table_html(
                    *servers_table(model),
                    "labkv-servers",
                    "no server events",
                    self._drawn["servers"],
                ),
            )
            if keys != self._known_keys:
                self._known_keys = keys
                self._set_options(self.key_filter, [("all keys", None)], keys)
                self._set_options(self.value_key, [("(first key)", None)], keys)
            self.plots.show_load(model)
        if changed or self.value_key.value != self._timeline_key:
            self._timeline_key = self.value_key.value
            self.plots.show_timeline(model, self._timeline_key)
        if changed or self._filters_dirty:
            self._filters_dirty = False
            log = log_table(
                model, self.key_filter.value, self.op_filter.value, self.rows, self._log_made
            )
            _set(self.log, value=table_html(*log, "labkv-log", "no events yet", self._drawn["log"]))
        with model.lock:
            waiting = any(not fan.current()["complete"] for fan in model.fanin.values())
        if changed or waiting:  # an unfinished round's waiting time keeps growing
            fan = fanin_table(model, time.time())
            fanin = table_html(*fan, "labkv-fanin", "no dist_sync rounds", self._drawn["fanin"])
            _set(self.fanin, value=fanin)
        if value.version != self._value_version:
            self._value_version = value.version
            self._show_value(value)

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
