"""The monitor's header counts and the legend that defines them.

The header counts calls the way the keys table does (a cluster's push once,
though its rank and its server both report it), so that the two agree; the
events behind them, per op, are a tooltip of the header's ``N events``.

>>> import labkv, numpy as np
>>> from ._model.monitor_model import MonitorModel
>>> kv = labkv.create("local")
>>> m = MonitorModel()
>>> sub = kv.events.subscribe(m.on_event)
>>> kv.init("w", np.zeros(3)); kv.push("w", np.ones(3)); _ = kv.pull("w")
>>> _ = m.flush()
>>> calls_line(m), events_by_op(m)
('push 1 · pull 1 · updater 0', 'init 1 · pull 1 · push 1')
>>> sub.unsubscribe()
"""

from __future__ import annotations

from operator import attrgetter

from ._model.monitor_model import MonitorModel

__all__ = ["LEGEND", "MARK", "OPS_LEGEND", "calls_line", "events_by_op"]

#: after a count: at least this many (a failover lost reports, see :func:`calls_line`)
MARK = "+"

#: the line under the dashboard's header
LEGEND = (
    "push, pull, updater: calls, as in the keys table (a cluster's push once, though "
    "rank and server both report it) · events: every report, per op on hover (ops: events tab)"
)

#: what the ops of the event log are, above it
OPS_LEGEND = (
    "update: a custom updater's call · optimizer: an optimizer's step · "
    "round: a dist_sync server's report of a key's round (who pushed, who is missing) · "
    "clock: a dist_ssp pull's view of the ranks' clocks · "
    "load: a server's byte counters (about every 0.1 s) · "
    "failover, reseed: a replicated server lost or gained a replica · "
    "pull ×3: one event for 3 calls (those only counted before it)"
)


def calls_line(model: MonitorModel, sep: str = " · ") -> str:
    """Pushes, pulls and updater calls summed over the keys table's keys; push
    and updater marked :data:`MARK` (at least) once a failover lost reports.

    >>> from labkv.events import Event
    >>> m = MonitorModel()
    >>> m.on_event(Event(0, 0.0, "s", "push", "w", server=0))
    >>> m.on_event(Event(1, 0.0, "s", "failover", None, server=0,
    ...     extra={"lost": ["tcp://a:1"], "promoted": True}))
    >>> _ = m.flush(); calls_line(m)
    'push 1+ · pull 0 · updater 0+'
    """
    with model.lock:
        stats = list(model.keys.values())
        mark = MARK if model.lost_reports else ""
    pushes = sum(map(attrgetter("pushes"), stats))
    pulls = sum(map(attrgetter("pulls"), stats))
    updates = sum(map(attrgetter("updates"), stats))
    return sep.join([f"push {pushes}{mark}", f"pull {pulls}", f"updater {updates}{mark}"])


def events_by_op(model: MonitorModel, sep: str = " · ") -> str:
    """The events received, per op (by name): what the header's tooltip says."""
    with model.lock:
        return sep.join(f"{op} {n}" for op, n in sorted(model.counts.items()))
