"""The parts of the dashboard that :meth:`Monitor.show` can show on their own.

Plain data (no ipywidgets), so a name is checked before any widget is built.

>>> check_part("fan-in")
'fan-in'
>>> check_part("fanin")
Traceback (most recent call last):
...
ValueError: no part 'fanin' of the monitor; the parts are 'keys', 'updates', 'fan-in', 'clocks', 'servers', 'events'
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["PARTS", "Part", "check_part"]


class Part(NamedTuple):
    """One part: the dashboard tab it lives in, its title, and the
    :class:`~labkv.widgets._views.Dashboard` widgets that draw it."""

    tab: str
    title: str
    widgets: tuple[str, ...]


#: by name, in the order of the dashboard's tabs. The bokeh plots (value, server
#: load, timeline) are not parts: a second view of a bokeh widget in the page starts
#: from the figure as first sent and would miss the changes made before it appeared.
PARTS: dict[str, Part] = {
    "keys": Part("keys", "keys", ("keys_pages", "keys")),
    "updates": Part("value & updates", "updater calls (newest first)", ("trace_note", "trace")),
    "fan-in": Part(
        "servers & rounds", "fan-in (dist_sync round)", ("fanin_note", "fanin_pages", "fanin")
    ),
    "clocks": Part("servers & rounds", "clocks (dist_ssp)", ("clocks",)),
    "servers": Part("servers & rounds", "server load", ("servers",)),
    "events": Part(
        "events", "events (newest first)", ("key_filter", "op_filter", "ops_legend", "log")
    ),
}


def check_part(name: str) -> str:
    """``name`` if it names a part, else ``ValueError`` listing the parts."""
    if name not in PARTS:
        names = ", ".join(map(repr, PARTS))
        raise ValueError(f"no part {name!r} of the monitor; the parts are {names}")
    return name
