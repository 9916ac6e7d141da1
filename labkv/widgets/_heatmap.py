"""The fan-in as a picture: keys x ranks of the current dist_sync rounds, one
byte a cell (complete, pushed, missing), drawn as one bokeh image. 500 keys x
64 ranks are 32,000 bytes; as an HTML table they were 34,000 cells and 1.16 MB.

>>> from labkv.events import Event
>>> from labkv.widgets._model.monitor_model import MonitorModel
>>> m = MonitorModel()
>>> for key, missing in (("a", []), ("b", [1])):
...     m.on_event(Event(0, 1.0, "dist_sync", "round", key, server=0, extra={"round": 2,
...         "pushed": [0, 2] + ([] if missing else [1]), "missing": missing,
...         "num_workers": 3, "waited_s": 0.0, "complete": not missing}))
>>> _ = m.flush()
>>> picture, keys, waiting = round_matrix(m)
>>> picture.tolist(), keys, waiting
([[1, 2, 1], [0, 0, 0]], ['b', 'a'], 1)
"""

from __future__ import annotations

import numpy as np

from ._fanin import waiting_first
from ._model.monitor_model import MonitorModel
from ._render.format import fmt_key

__all__ = ["COMPLETE", "HEAT_KEYS", "MISSING", "PUSHED", "HeatMap", "round_matrix"]

#: a cell: the key's round is complete; the rank pushed (the round waits); it did not
COMPLETE, PUSHED, MISSING = 0, 1, 2
#: colours of the three, in order
COLORS = ("#e8e8e8", "#8fd18f", "#d62728")
#: keys drawn at most, the waiting ones first (a 2,000-key picture is still 128 KB)
HEAT_KEYS = 2000


def round_matrix(
    model: MonitorModel, max_keys: int = HEAT_KEYS
) -> tuple[np.ndarray, list[str], int]:
    """``(picture, keys, waiting)``: a ``uint8`` array of keys x ranks (see
    :data:`COMPLETE`, :data:`PUSHED`, :data:`MISSING`), top row first, the keys
    waiting longest first; the keys' names, in that order; how many keys wait."""
    rounds, waiting = waiting_first(model)
    rounds = rounds[:max_keys]
    workers = max((r["num_workers"] for _, r in rounds), default=0)
    picture = np.zeros((len(rounds), workers), np.uint8)
    for i, (_, r) in enumerate(rounds):
        if r["complete"]:
            continue
        row = picture[i]
        row[:] = MISSING
        pushed = [rank for rank in r["pushed"] if rank < workers]
        row[pushed] = PUSHED
    return picture, [fmt_key(k) for k, _ in rounds], waiting


class HeatMap:
    """The bokeh figure of :func:`round_matrix` in a widget made by ``widget_class``;
    hidden until a round is reported and while no round waits (every cell would be
    grey: the line above the grid says every round is complete), and sent only when
    the picture changed."""

    def __init__(self, widget_class: type) -> None:
        from bokeh.models import ColumnDataSource, LinearColorMapper, Range1d
        from bokeh.plotting import figure

        self._seen: tuple | None = None
        empty = {"image": [np.zeros((1, 1), np.uint8)], "w": [1], "h": [1]}
        self.source = ColumnDataSource(data=empty)
        fig = figure(
            height=220,
            width=460,
            tools="reset,save,hover",
            toolbar_location="right",
            x_axis_label="rank",
            y_axis_label="keys, waiting longest at the top",
            title="rounds: no dist_sync rounds",
            tooltips=[("rank", "$x{0}"), ("key row", "$y{0}")],
            # set with each picture: ranges fitted to the data were left at 0..1 when the
            # figure was first drawn hidden; y from the last row (bottom) to 0 (top)
            x_range=Range1d(0, 1),
            y_range=Range1d(1, 0),
        )
        mapper = LinearColorMapper(palette=list(COLORS), low=COMPLETE, high=MISSING)
        fig.image("image", x=0, y=0, dw="w", dh="h", source=self.source, color_mapper=mapper)
        self.fig = fig
        self.widget = widget_class(fig)
        self.widget.add_class("labkv-heatmap")  # found by the browser tests
        self.widget.layout.display = "none"

    def show(self, model: MonitorModel) -> None:
        """Draw the model's rounds (nothing is sent when the picture is the same)."""
        picture, keys, waiting = round_matrix(model)
        seen = (picture.shape, picture.tobytes(), waiting)
        if seen == self._seen or not keys:
            return
        self._seen = seen
        if not waiting:  # every round complete: an all-grey box would show nothing
            self.widget.layout.display = "none"
            return
        self.widget.layout.display = None
        missing = int((picture == MISSING).sum())
        self.fig.title.text = (
            f"{len(keys)} keys x {picture.shape[1]} ranks: {waiting} waiting, "
            f"{missing} cells missing\nred missing, green pushed, grey complete"
        )
        rows, cols = picture.shape
        self.fig.x_range.end, self.fig.y_range.start = cols, rows
        # the y axis runs down: the image's row 0, drawn at y = 0, is at the top
        self.source.data = {"image": [picture], "w": [cols], "h": [rows]}
