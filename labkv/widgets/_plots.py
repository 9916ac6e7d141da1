"""The dashboard's bokeh figures: the chosen key's value (heatmap or line), the
servers' bytes over time, and the timeline of the last seconds' spans.

Each ``show_...`` sends a document change only when what it draws changed.
Without bokeh or jupyter_bokeh the figures are a note saying what to install.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import ipywidgets as W
import numpy as np

from ._heatmap import HeatMap
from ._model.monitor_model import MonitorModel
from ._render.format import fmt_key
from ._render.html import esc
from ._timeline import COLUMNS as TIMELINE_COLUMNS
from ._timeline import fold_tracks, timeline_view

__all__ = ["TIMELINE_S", "Plots"]

_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
#: seconds of events the timeline shows, before the newest
TIMELINE_S = 5.0
#: the timeline's numeric columns, sent as arrays (bokeh sends those as binary buffers:
#: far cheaper to encode than lists of numbers)
_NUMERIC = ("left", "right", "bytes", "waited_ms")


@functools.cache
def _bokeh_widget_class() -> type:
    from jupyter_bokeh.widgets import BokehModel

    class BokehWidget(BokehModel):
        """``BokehModel`` that knows when the page may lack its changes.

        A view of a bokeh widget draws the document as the widget's
        ``render_bundle`` holds it, taken when the widget was made, and then
        applies the patches that reach it: a patch sent while the page had no view
        (a monitor displayed after its events) is lost, and so is every change made
        before a second view appeared. The page counts its views (ipywidgets'
        ``_view_count``), so ``stale`` says when the bundle must be sent again
        (:meth:`resend`). Its ``close`` may run twice (ours, then ``__del__``'s);
        jupyter_bokeh's raises ``KeyError`` the second time."""

        _labkv_closed = False

        def __init__(self, model: Any) -> None:
            #: the page's views may lack changes: :meth:`resend` brings them up to date
            self.stale = False
            self._patched = False  # patches sent since the bundle was made
            self.patches = 0  # patches sent in all
            super().__init__(model)
            self._view_count = 0  # 0, not None: the page reports its views from now on
            self.observe(self._views_changed, names="_view_count")

        def _document_patched(self, event: Any) -> None:
            self._patched = True
            self.patches += 1
            if not self._view_count:
                self.stale = True  # nobody receives this patch
            super()._document_patched(event)

        def _views_changed(self, change: Any) -> None:
            if (change["new"] or 0) > (change["old"] or 0) and self._patched:
                self.stale = True  # a new view starts from the bundle, without the patches

        def resend(self) -> bool:
            """Send the whole document again when the page may lack some of it;
            returns whether it did (every view draws it anew)."""
            if not self.stale:
                return False
            self.stale = self._patched = False
            self.render_bundle = self._model_to_traits(self._model)
            return True

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


class Plots:
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
            self.timeline_widget = self.heat_widget = self.value_widget
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
            # no y label: the unit changes as the bytes grow, and BokehJS redraws a
            # changed title, not a changed label (a fixed "bytes" read wrong in MiB)
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
        self.heatmap = HeatMap(BokehModel)
        self.heat_widget = self.heatmap.widget
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

    def resend(self, widgets: tuple[Any, ...]) -> None:
        """Send again the plots of ``widgets`` (those of a tab the page shows now)
        that the page may lack: drawn while hidden, before the page had a view of
        them, or before a new view appeared (see ``BokehWidget``). BokehJS lays
        out and paints a plot only while it is visible, so a plot changed while its
        tab was hidden showed stale parts (old data, no colour bar, an old title)."""
        if self.available:
            for widget in widgets:
                widget.resend()

    @contextlib.contextmanager
    def hidden(self, widgets: tuple[Any, ...]) -> Iterator[None]:
        """Draw ``widgets`` while their tab is hidden (a closed monitor's last
        picture): those that changed are stale until their tab is shown."""
        before = [w.patches for w in widgets] if self.available else []
        yield
        for widget, patches in zip(widgets, before):
            widget.stale = widget.stale or widget.patches != patches

    def show_timeline(self, model: MonitorModel, key: Any = None) -> None:
        """The last ``TIMELINE_S`` seconds of spans (of ``key``, or of every key)."""
        if not self.available:
            return
        tracks, bars, total = timeline_view(model, key, TIMELINE_S)
        seen = (key, tracks, total, len(bars["op"]), bars["right"][-1:], bars["left"][:1])
        if seen == self._timeline_seen:
            return
        self._timeline_seen = seen
        shown, bars = fold_tracks(tracks, bars)
        what = "every key" if key is None else f"key {fmt_key(key)}"
        waits = sum(1 for op in bars["op"] if op in ("clock", "round"))
        spans = (
            f"{total} spans" if total == len(bars["op"]) else f"{len(bars['op'])} of {total} spans"
        )
        held = model.held_s()  # less than TIMELINE_S when the ring keeps less
        span = f"last {TIMELINE_S:g} s" if held >= TIMELINE_S else f"last {held:.2g} s (all kept)"
        folded = f", {len(tracks)} tracks in {len(shown)}" if len(shown) < len(tracks) else ""
        self.timeline_fig.title.text = (
            f"timeline of {what}, {span}: {spans}, {waits} waits (red){folded}"
        )
        tracks = shown
        self.timeline_fig.y_range.factors = list(reversed(tracks))
        self.timeline_source.data = {
            c: np.asarray(v) if c in _NUMERIC else v for c, v in bars.items()
        }

    def show_heatmap(self, model: MonitorModel) -> None:
        """The keys x ranks picture of the dist_sync rounds (:mod:`._heatmap`)."""
        if self.available:
            self.heatmap.show(model)

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
