"""Live views of a store's events: ``monitor(kv)`` in a notebook cell.

The model (counters, rings, per-key table, updater trace, fan-in, server
load) works anywhere; the ipywidgets + bokeh dashboard is built only when the
monitor is displayed, so ipywidgets and bokeh are needed only then.

>>> import labkv, numpy as np
>>> from labkv.widgets import monitor
>>> kv = labkv.create("local")
>>> mon = monitor(kv)
>>> kv.init("w", np.zeros(4))
>>> _ = kv.pull("w")
>>> mon.model.flush(), mon.model.keys["w"].pulls
(2, 1)
>>> mon.close()
"""

from __future__ import annotations

from typing import Any

from ._model.monitor_model import MonitorModel
from ._monitor import Monitor

__all__ = ["Monitor", "MonitorModel", "monitor"]


def monitor(kv: Any, **options: Any) -> Monitor:
    """A :class:`Monitor` watching ``kv`` (any labkv store); display it in a
    cell for the live dashboard, ``mon.show("fan-in")`` (see :meth:`Monitor.show`)
    for one part of it where it matters, or ``print`` it for text. ``options`` go to
    :class:`Monitor` (``hz``, ``rows``, ``log_size``, ``trace_size``, ``timeline_size``, ``timeline_s``,
    ``refresh_cpu``, ``hidden_tabs_s``)."""
    return Monitor(kv, **options)
