"""The event log's table: the newest events first, each row made once.

>>> from labkv.events import Event
>>> log_row(Event(0, 0.0, "s", "rank-lost", None, extra={"worker": "tcp://a:1"}))[-1]
'worker tcp://a:1 lost; resumes at the start'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..events import Event
from ._model.monitor_model import MonitorModel
from ._render.format import fmt_bytes, fmt_key, fmt_shape, fmt_summary, fmt_time, fmt_where

__all__ = ["GROUP_SPAN", "EventRows", "log_groups", "log_row", "log_table", "log_view"]

Table = tuple[list[str], list[list[str]]]


def log_table(
    model: MonitorModel,
    key: Any = None,
    op: str | None = None,
    limit: int = 30,
    cache: EventRows | None = None,
) -> Table:
    """The newest logged events first (by time), optionally one key and/or one op;
    ``cache``: an :class:`EventRows` of :func:`log_row` that a live view keeps."""
    # No sequence numbers: each process numbers its own events, so servers' and
    # ranks' numbers side by side would read as out of order; the time is one clock.
    headers = ["time", "op", "key", "rank", "where", "shape", "bytes", "value"]
    events = model.events(key, op, limit)
    return headers, (cache or EventRows(log_row)).rows(events)


#: the dashboard's log groups its events when its rows would cover less than this
#: many seconds: at 64 ranks x 500 keys thirty rows are a few milliseconds of one
#: rank's records, and read as noise
GROUP_SPAN = 1.0


def log_view(
    model: MonitorModel,
    key: Any = None,
    op: str | None = None,
    limit: int = 30,
    cache: EventRows | None = None,
) -> tuple[list[str], list[list[str]], str]:
    """The log the dashboard draws: ``(headers, rows, caption)``. :func:`log_table`
    while its ``limit`` newest rows span :data:`GROUP_SPAN` seconds or more, else
    :func:`log_groups` of every event the log keeps.

    >>> m = MonitorModel()
    >>> for i in range(40):
    ...     m.on_event(Event(i, 100.0 + i / 1000, "s", "push", i % 8, rank=i % 4, nbytes=8))
    >>> _ = m.flush()
    >>> headers, rows, caption = log_view(m, limit=10)
    >>> headers[:4], rows[0][:6], caption
    (['op', 'where', 'events', 'calls'], ['push', 'ranks', '40', '40', '8', '4'], '40 events of the last 0.039 s, grouped by op and place')
    """
    events = model.events(key, op, limit=max(len(model.log), limit))
    shown = events[:limit]
    if len(events) <= limit or shown[0].time - shown[-1].time >= GROUP_SPAN:
        headers, rows = log_table(model, key, op, limit, cache)
        return headers, rows, ""
    span = events[0].time - events[-1].time
    caption = f"{len(events)} events of the last {span:.2g} s, grouped by op and place"
    return (*log_groups(events), caption)


def log_groups(events: list[Event]) -> Table:
    """``events`` as one row per op and place (each server, or the ranks), the
    newest first: how many events, the calls they stand for (exact: a counted
    event's ``count``), keys, ranks, bytes and rows moved, and the newest time."""
    headers = ["op", "where", "events", "calls", "keys", "ranks", "bytes", "rows", "newest"]
    groups: dict[tuple[str, str], list] = {}
    for e in events:
        where = "ranks" if e.server is None else f"server {e.server}"
        g = groups.get((e.op, where))
        if g is None:
            g = groups[(e.op, where)] = [0, 0, set(), set(), 0, 0, e.time]
        g[0] += 1
        g[1] += e.count
        g[2].update(e.extra["keys"] if e.key is None and "keys" in e.extra else (e.key,))
        g[3].add(e.rank)
        g[4] += e.nbytes
        rows = e.extra.get("rows", 0)
        g[5] += sum(rows) if isinstance(rows, list) else rows
        g[6] = max(g[6], e.time)
    ordered = sorted(groups.items(), key=lambda item: -item[1][6])
    return headers, [
        [op, where, str(n), str(calls), str(len(keys - {None})), str(len(ranks)), fmt_bytes(b)]
        + [str(rows) if rows else "-", fmt_time(t)]
        for (op, where), (n, calls, keys, ranks, b, rows, t) in ordered
    ]


def log_row(e: Event) -> list[str]:
    """One event's row of :func:`log_table`. An event that stands for calls the
    bus only counted before it (its ``count``) says so: ``pull ×3``, and its
    bytes per call.

    >>> log_row(Event(0, 0.0, "s", "pull", 3, count=3, nbytes=72))[1:2] + log_row(
    ...     Event(0, 0.0, "s", "pull", 3, count=3, nbytes=72))[6:7]
    ['pull ×3', '24 B each']
    """
    count = e.count
    op = e.op if count == 1 else f"{e.op} ×{count}"
    if not e.nbytes:
        moved = "-"
    elif count == 1:
        moved = fmt_bytes(e.nbytes)
    elif e.nbytes % count == 0:
        moved = f"{fmt_bytes(e.nbytes // count)} each"
    else:  # calls of different sizes
        moved = f"{fmt_bytes(e.nbytes)} in all"
    return [
        fmt_time(e.time),
        op,
        fmt_key(e.key),
        str(e.rank),
        fmt_where(e),
        fmt_shape(e.shape, "-"),
        moved,
        _event_value(e),
    ]


class EventRows:
    """Table rows of events, each made once: an event never changes, and a live
    view draws mostly the rows it drew last time. Holds the last call's events
    only, so it stays as small as the table.

    >>> from labkv.events import Event
    >>> rows = EventRows(lambda e: [e.op])
    >>> e = Event(0, 0.0, "s", "push", 1)
    >>> rows.rows([e]), rows.rows([e])[0] is rows.rows([e])[0]
    ([['push']], True)
    """

    def __init__(self, make: Callable[[Event], list[str]]):
        self._make = make
        self._rows: dict[int, tuple[Event, list[str]]] = {}

    def rows(self, events: list[Event]) -> list[list[str]]:
        """The rows of ``events``, in order."""
        made = {}
        for e in events:
            hit = self._rows.get(id(e))
            # identity, not just id(): an id may be reused once its event is gone
            made[id(e)] = hit if hit is not None and hit[0] is e else (e, self._make(e))
        self._rows = made
        return [made[id(e)][1] for e in events]


def _event_value(e: Event) -> str:
    if e.op == "round":
        x = e.extra
        if e.key is None and "round_columns" in x:  # a server's record of many keys
            return f"rounds of {len(x['round_columns'][0])} keys"
        return f"round {x.get('round')} pushed {sorted(x.get('pushed', ()))} missing {sorted(x.get('missing', ()))}"
    if e.op in ("failover", "reseed"):
        return _group_change(e.extra)
    if e.op in ("rank-lost", "rank-replaced", "rank-dropped"):
        return _rank_change(e.op, e.extra)
    if e.after is not None:
        return f"{fmt_summary(e.before)} -> {fmt_summary(e.after)}"
    return fmt_summary(e.summary)


def _rank_change(op: str, x: dict) -> str:
    """What a ``rank-lost``, ``rank-replaced`` or ``rank-dropped`` event says
    (see ``run(..., on_rank_loss=)``).

    >>> _rank_change("rank-lost", {"worker": "tcp://a:1", "step": 6})
    'worker tcp://a:1 lost; resumes at step 6'
    >>> _rank_change("rank-replaced", {"worker": "tcp://b:2", "incarnation": 1, "step": 6, "seconds": 0.8})
    'replaced on tcp://b:2 (incarnation 1) at step 6, placed in 0.8 s'
    >>> _rank_change("rank-dropped", {"worker": "tcp://a:1", "step": 6, "ranks_left": 3})
    'worker tcp://a:1 lost at step 6; the run goes on without it (3 ranks left)'
    """
    step = x.get("step")
    at = "the start" if step is None else f"step {step}"
    if op == "rank-lost":
        return f"worker {x.get('worker')} lost; resumes at {at}"
    if op == "rank-dropped":
        left = x.get("ranks_left")
        return (
            f"worker {x.get('worker')} lost at {at}; the run goes on without it "
            f"({left} rank{'' if left == 1 else 's'} left)"
        )
    return (
        f"replaced on {x.get('worker')} (incarnation {x.get('incarnation')}) at {at}, "
        f"placed in {x.get('seconds')} s"
    )


def _group_change(x: dict) -> str:
    """What a ``failover`` or ``reseed`` event did to a server's replicas.

    >>> _group_change({"lost": ["tcp://a:1"], "replicas": ["tcp://b:2"]})
    'lost tcp://a:1; replicas now tcp://b:2 (primary first)'
    """
    parts = []
    if x.get("lost"):
        parts.append(f"lost {', '.join(x['lost'])}")
    if x.get("added"):
        parts.append(f"seeded {x['added']}")
    if x.get("error"):  # a re-seed that failed: the store carries on with fewer replicas
        parts.append(f"no new replica: {x['error']}")
    parts.append(f"replicas now {', '.join(x.get('replicas', ()))} (primary first)")
    return "; ".join(parts)
