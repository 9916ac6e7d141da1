"""The monitor's sections as plain tables of strings: ``(headers, rows)``.

Text and HTML rendering both start here, so what a script prints and what a
notebook shows are the same numbers. Nothing here is escaped: that is the
HTML renderer's job, done once at its one sink.

>>> from labkv.events import Event
>>> from labkv.widgets._model import MonitorModel
>>> m = MonitorModel()
>>> m.on_event(Event(0, 0.0, "s", "update", 3, summary={"min": 1.0, "max": 1.0, "mean": 1.0,
...     "norm": 2.4}, before={"min": 4.0, "max": 4.0, "mean": 4.0, "norm": 9.8},
...     after={"min": 6.0, "max": 6.0, "mean": 6.0, "norm": 14.7}))
>>> _ = m.flush()
>>> trace_table(m)[1][0][-1]
'stored += input * 2'
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from ..events import Event
from ._model import MonitorModel

__all__ = [
    "EventRows",
    "clocks_table",
    "fanin_table",
    "fmt_bytes",
    "fmt_key",
    "fmt_num",
    "fmt_shape",
    "keys_table",
    "log_row",
    "log_table",
    "servers_table",
    "trace_note",
    "trace_row",
    "trace_table",
]

Table = tuple[list[str], list[list[str]]]


def fmt_num(x: float | None) -> str:
    """Four significant digits; ``-`` for nothing.

    >>> fmt_num(2.0), fmt_num(1234567.0), fmt_num(None)
    ('2', '1.235e+06', '-')
    """
    return "-" if x is None else f"{x:.4g}"


def fmt_bytes(n: int | None) -> str:
    """Bytes with a binary unit.

    >>> fmt_bytes(24), fmt_bytes(3 * 2**20)
    ('24 B', '3.0 MiB')
    """
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(n)  # unreachable


def fmt_key(key: Any) -> str:
    """Keys as the user wrote them: ``3``, ``w``."""
    return "-" if key is None else str(key)


def fmt_shape(shape: tuple[int, ...], empty: str = "()") -> str:
    """``2x3``; ``empty`` for a 0-d (or unknown) shape.

    >>> fmt_shape((2, 3)), fmt_shape(())
    ('2x3', '()')
    """
    return "x".join(map(str, shape)) or empty


def fmt_time(t: float) -> str:
    """Local wall-clock time with milliseconds."""
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


def fmt_summary(s: dict[str, float] | None) -> str:
    """``mean (min..max)``, the compact form used in the log."""
    if not s:
        return "-"
    return f"{fmt_num(s.get('mean'))} ({fmt_num(s.get('min'))}..{fmt_num(s.get('max'))})"


def fmt_where(e: Event) -> str:
    """Where an event happened: its server, else its devices."""
    if e.server is not None:
        return f"server {e.server}"
    if len(e.devices) > 2:
        return f"{e.devices[0]} +{len(e.devices) - 1}"
    return " ".join(e.devices) or "-"


def fmt_placement(pieces: list[dict[str, Any]] | None) -> str:
    """``kv.placement()`` entries for one key: ``s0[0:512] s1[512:1024]`` or ``cpu(0)``."""
    if not pieces:
        return "-"
    out = []
    for p in pieces:
        where = p.get("device", "?") if p.get("server") is None else f"s{p['server']}"
        if len(pieces) > 1:
            where += f"[{p.get('start')}:{p.get('stop')}]"
        out.append(str(where))
    return " ".join(out)


def keys_table(model: MonitorModel, placement: dict[Any, Any] | None = None) -> Table:
    """Per key: counts, bytes, last value summary, last change, placement."""
    headers = ["key", "shape", "push", "pull", "updater", "in", "out"]
    headers += ["min", "max", "mean", "norm", "last change", "placement"]
    rows = []
    with model.lock:
        stats = list(model.keys.values())
    for s in stats:
        v = s.value or {}
        change = f"{s.last_op} {fmt_time(s.last_change)}" if s.last_op else "-"
        rows.append(
            [
                fmt_key(s.key),
                fmt_shape(s.shape),
                str(s.pushes),
                str(s.pulls),
                str(s.updates),
                fmt_bytes(s.bytes_in),
                fmt_bytes(s.bytes_out),
                *(fmt_num(v.get(f)) for f in ("min", "max", "mean", "norm")),
                change,
                fmt_placement((placement or {}).get(s.key)),
            ]
        )
    return headers, rows


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


def log_row(e: Event) -> list[str]:
    """One event's row of :func:`log_table`."""
    return [
        fmt_time(e.time),
        e.op,
        fmt_key(e.key),
        str(e.rank),
        fmt_where(e),
        fmt_shape(e.shape, "-"),
        fmt_bytes(e.nbytes) if e.nbytes else "-",
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


def reads_as(e: Event) -> str:
    """What the update did to the mean, as code: ``stored += input * 2``."""
    try:
        delta = e.after["mean"] - e.before["mean"]  # type: ignore[index]
        k = delta / e.summary["mean"]  # type: ignore[index]
    except (TypeError, KeyError, ZeroDivisionError):
        return "-"
    if not math.isfinite(k):
        return "-"
    return f"stored += input * {k:.4g}"


def trace_table(model: MonitorModel, limit: int = 20, cache: EventRows | None = None) -> Table:
    """Updater and optimizer calls, newest first (by time): merged input, stored
    before -> after;
    ``cache``: an :class:`EventRows` of :func:`trace_row` that a live view keeps."""
    headers = ["time", "key", "op", "input mean (min..max)", "stored before", "stored after"]
    headers += ["on the mean"]
    with model.lock:
        events = sorted(reversed(model.trace), key=lambda e: e.time, reverse=True)[:limit]
    return headers, (cache or EventRows(trace_row)).rows(events)


def trace_note(model: MonitorModel, shown: int) -> str:
    """How many of the updater calls a trace of ``shown`` rows shows: under load
    most calls are only counted, and the rows are a sample.

    >>> trace_note(MonitorModel(), 0)
    'no calls'
    """
    with model.lock:
        total = sum(s.updates for s in model.keys.values())
    if not total:
        return "no calls"
    if shown >= total:
        return f"all {total} calls shown"
    return f"{shown} of {total} calls shown; the others were counted, not sampled"


def trace_row(e: Event) -> list[str]:
    """One updater call's row of :func:`trace_table`."""
    return [
        fmt_time(e.time),
        fmt_key(e.key),
        e.op if e.op == "update" else f"{e.op} {e.extra.get('optimizer', '')}".strip(),
        fmt_summary(e.summary),
        fmt_summary(e.before),
        fmt_summary(e.after),
        reads_as(e),
    ]


def fanin_table(model: MonitorModel) -> Table:
    """Keys x ranks of each key's current ``dist_sync`` round: ``pushed``/``MISSING``.
    ``waited`` is what a finished round took, or when a waiting one began: the grid
    changes with the rounds, not with the clock (:func:`~labkv.widgets._fanin.fanin_note`
    says how long)."""
    with model.lock:
        rounds = [(key, fan.current()) for key, fan in model.fanin.items()]
    workers = max((r["num_workers"] for _, r in rounds), default=0)
    headers = ["key", "round", "waited", "state"] + [f"rank {i}" for i in range(workers)]
    rows = [fanin_row(key, r, range(workers)) for key, r in rounds]
    return headers, rows


def fanin_row(key: Any, r: dict[str, Any], ranks: Any) -> list[str]:
    """One key's row of the fan-in grid: key, round, waited, state, and the cell
    of each of ``ranks``. ``waited`` is what a finished round took, or when a
    waiting one began."""
    if r["complete"]:
        waited = f"{r['waited_s']:.1f} s"
    else:
        waited = f"since {fmt_time(r['time'] - r['waited_s'])}"
    cells = []
    for rank in ranks:
        if rank in r["pushed"] or r["complete"]:
            cells.append("pushed")
        elif rank in r["missing"]:
            cells.append("MISSING")
        else:
            cells.append("-")
    state = "complete" if r["complete"] else f"waiting for {len(r['missing'])}"
    return [fmt_key(key), str(r["round"]), waited, state, *cells]


def clocks_table(model: MonitorModel) -> Table:
    """Keys x ranks of dist_ssp clocks: each rank's clock and how long its pulls
    waited (in total, and the last one); the slowest rank named, and marked.

    >>> m = MonitorModel()
    >>> m.on_event(Event(0, 0.0, "s", "clock", "w", rank=0, extra={"clocks": [5, 2],
    ...     "staleness": 3, "waited_s": 0.5}))
    >>> _ = m.flush()
    >>> clocks_table(m)
    (['key', 'staleness', 'slowest', 'spread', 'rank 0', 'rank 1'], [['w', '3', 'rank 1', '3', '5 · waited 0.50 s (last 0.50 s)', '2 SLOWEST']])
    """
    with model.lock:
        keys = [
            (k, list(c.clocks), c.staleness, c.slowest(), dict(c.waited), dict(c.last_wait))
            for k, c in model.clocks.items()
        ]
    workers = max((len(clocks) for _, clocks, *_ in keys), default=0)
    headers = ["key", "staleness", "slowest", "spread"] + [f"rank {i}" for i in range(workers)]
    rows = []
    for key, clocks, staleness, slowest, waited, last in keys:
        cells = []
        for rank in range(workers):
            clock = clocks[rank] if rank < len(clocks) else 0
            cell = str(clock)
            if rank in waited:
                cell += f" · waited {waited[rank]:.2f} s (last {last[rank]:.2f} s)"
            if rank in slowest and len(slowest) < len(clocks):
                cell += " SLOWEST"
            cells.append(cell)
        named = ", ".join(f"rank {r}" for r in slowest) if len(slowest) < len(clocks) else "-"
        spread = max(clocks) - min(clocks) if clocks else 0
        rows.append([fmt_key(key), str(staleness), named, str(spread), *cells])
    return headers, rows


def servers_table(model: MonitorModel) -> Table:
    """Per server: its device, cumulative bytes in and out, keys and bytes held;
    for replicated servers also their workers, the primary first and marked."""
    headers = ["server", "device", "bytes in", "bytes out", "keys", "bytes held"]
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
