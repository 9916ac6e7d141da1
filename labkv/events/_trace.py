"""Events as a Chrome / Perfetto trace (the ``traceEvents`` JSON format).

Open the file in https://ui.perfetto.dev or ``chrome://tracing``. Each rank and
each server is a process in the trace; its threads are the tracks:

- rank ``r``: ``calls`` (its push, pull and init calls, from the call's start to
  its end) and ``updates`` (updater and optimizer steps run in that process);
- server ``s``: ``receipts`` (pushes it received), ``updates``, ``rounds``
  (a dist_sync round, from its first push to its last) and one ``waits of
  rank r`` track per rank (a dist_ssp pull waiting for the slowest rank).

Every trace event has ``ph``, ``ts`` (microseconds), ``pid``, ``tid`` and ``name``
(the process and thread names too, as ``M`` events at ``ts`` 0). Every event
becomes one span (a ``B`` and its ``E``), but a dist_sync
server's report of a push joining a round that is still open, an instant
(``i``). A span's arguments are ``key``,
``bytes``, ``count`` (calls it stands for: the bus may count busy calls without
detail), ``rank`` and ``round``: for a push, the how-many-th push of that key
by that rank among the events exported (a dist_ssp clock, a dist_sync round);
for a pull, the pushes of the key by that rank so far; for a dist_ssp wait, the
puller's clock. Spans last from the call's start when the event knows it (a
store's push and pull; a wait's ``waited_s``) and 1 us otherwise; a span that
would begin before the previous one on its track ended begins at that end, so
the spans of a track never overlap and every begin has its end.

>>> import labkv, numpy as np
>>> kv = labkv.create("local")
>>> kv.events.record()
>>> kv.init("w", np.zeros(3)); kv.push("w", np.ones(3)); _ = kv.pull("w")
>>> trace = to_trace(kv.events.recent())
>>> [(e["name"], e["ph"]) for e in trace["traceEvents"] if e["ph"] in "BE"]
[('init', 'B'), ('init', 'E'), ('push', 'B'), ('push', 'E'), ('pull', 'B'), ('pull', 'E')]
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from ._event import per_key

__all__ = ["export_trace", "to_trace"]

_MIN_US = 1.0  # the length of a span whose event knows no duration
_SERVER_PID = 1000  # server s is process 1000 + s; rank r is process 1 + r
_CALLS, _UPDATES = 0, 1  # threads of a rank; of a server: receipts, updates, waits
_ROUNDS = 2  # server thread 2: dist_sync rounds
_WAITS = 3  # server thread 3 + r: the waits of rank r
_UPDATER_OPS = frozenset({"update", "optimizer"})
_SKIPPED = frozenset({"load", "server"})  # server load reports: not spans


def _track(e: Any) -> tuple[int, int]:
    """``(pid, tid)`` of an event (see module doc)."""
    op = e.op
    if e.server is None:
        return 1 + e.rank, _UPDATES if op in _UPDATER_OPS else _CALLS
    pid = _SERVER_PID + int(e.server)
    if op == "round":
        return pid, _ROUNDS
    if op == "clock":
        return pid, _WAITS + e.rank
    return pid, _UPDATES if op in _UPDATER_OPS else _CALLS


def to_trace(
    events: Iterable[Any],
    keys: Iterable[Any] | None = None,
    ranks: Iterable[int] | None = None,
) -> dict[str, Any]:
    """``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {"start_time":
    t0}}`` of ``events`` (``ts`` in microseconds after ``t0``; see
    module doc), keeping only the events of ``keys`` and of ``ranks`` when given
    (a server's update events name no rank: they stay).

    >>> from labkv.events import Event
    >>> t = to_trace([Event(0, 10.0, "s", "push", "w", rank=1, nbytes=8)], ranks=[1])
    >>> [(e["ph"], e["pid"], e["args"]["round"]) for e in t["traceEvents"] if e["ph"] == "B"]
    [('B', 2, 1)]
    """

    keep_keys = None if keys is None else set(keys)
    keep_ranks = None if ranks is None else set(ranks)
    events = [
        e
        for record in events
        for e in per_key(record)
        if e.op not in _SKIPPED
        and (keep_keys is None or e.key in keep_keys)
        and (
            keep_ranks is None
            or e.rank in keep_ranks
            or (e.server is not None and e.op in _UPDATER_OPS)
        )
    ]
    rows = sorted((_begin(e), e.seq, i, e) for i, e in enumerate(events))
    t0 = rows[0][0] if rows else 0.0
    pushes: dict[tuple, int] = {}  # (server, rank, key) -> pushes seen
    ends: dict[tuple[int, int], float] = {}  # track -> end of its last span
    names: dict[tuple[int, int], str] = {}
    out: list[dict[str, Any]] = []
    for begin, _, _, e in rows:
        pid, tid = track = _track(e)
        op, extra = e.op, e.extra
        end = (e.time - t0) * 1e6
        begin = (begin - t0) * 1e6
        if end - begin < _MIN_US:
            begin = end - _MIN_US
        last = ends.get(track)
        if last is not None and begin < last:
            begin = last
            end = max(end, begin + _MIN_US)
        ends[track] = end
        counter = (e.server, e.rank, e.key)
        if op == "push" and not e.first_piece:
            seen = pushes.get(counter, 0)  # another slice of a push counted on server 0
        elif op == "push":
            seen = pushes[counter] = pushes.get(counter, 0) + e.count
        else:
            seen = pushes.get(counter, 0)
        args = {"key": str(e.key), "bytes": e.nbytes, "count": e.count, "rank": e.rank}
        args["round"] = extra.get("clock", extra.get("round", seen))
        if op == "clock":
            args["clocks"] = list(extra.get("clocks", ()))
            args["waited_ms"] = round(extra.get("waited_s", 0.0) * 1e3, 3)
        if track not in names:
            names[track] = _name(e, tid)
        if op == "round" and not extra.get("complete"):
            instant = {"name": op, "ph": "i", "s": "t", "ts": end, "pid": pid, "tid": tid}
            out.append(instant | {"args": args})
            continue
        out.append({"name": op, "ph": "B", "ts": begin, "pid": pid, "tid": tid, "args": args})
        out.append({"name": op, "ph": "E", "ts": end, "pid": pid, "tid": tid})
    meta = []
    for pid in sorted({p for p, _ in names}):
        label = f"server {pid - _SERVER_PID}" if pid >= _SERVER_PID else f"rank {pid - 1}"
        meta.append(_meta("process_name", pid, 0, label))
        meta.append(_meta("process_sort_index", pid, 0, pid, key="sort_index"))
    for (pid, tid), label in sorted(names.items()):
        meta.append(_meta("thread_name", pid, tid, label))
    # otherData: free-form metadata the format allows; when ts 0 is (seconds since the epoch)
    return {"traceEvents": meta + out, "displayTimeUnit": "ms", "otherData": {"start_time": t0}}


def _begin(e: Any) -> float:
    """When the span of ``e`` began (seconds since the epoch, as ``e.time``)."""
    return e.extra.get("start") or e.time - e.extra.get("waited_s", 0.0)


def _name(e: Any, tid: int) -> str:
    if e.server is None:
        return "updates" if tid == _UPDATES else "calls"
    if tid >= _WAITS:
        return f"waits of rank {tid - _WAITS}"
    if tid == _ROUNDS:
        return "rounds"
    return "updates" if tid == _UPDATES else "receipts"


def _meta(name: str, pid: int, tid: int, value: Any, key: str = "name") -> dict[str, Any]:
    # ts is optional for metadata in the format; given, every event has the same fields
    return {"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": {key: value}}


def export_trace(
    events: Iterable[Any],
    path: str | os.PathLike,
    keys: Iterable[Any] | None = None,
    ranks: Iterable[int] | None = None,
) -> dict[str, int]:
    """Write :func:`to_trace` of ``events`` to ``path`` as JSON; returns the
    number of ``push`` and ``pull`` calls the trace's spans stand for.

    >>> import labkv, numpy as np, tempfile, os
    >>> kv = labkv.create("local")
    >>> kv.events.record()
    >>> kv.init(0, np.zeros(2)); kv.push(0, np.ones(2)); kv.push(0, np.ones(2))
    >>> export_trace(kv.events.recent(), os.path.join(tempfile.mkdtemp(), "run.json"))
    {'push': 2, 'pull': 0}
    """
    trace = to_trace(events, keys, ranks)
    text = json.dumps(trace, separators=(",", ":"))  # one string: json.dump writes in pieces
    with open(path, "w") as f:
        f.write(text)
    counts = {"push": 0, "pull": 0}
    for e in trace["traceEvents"]:
        if e["ph"] == "B" and e["name"] in counts and e["pid"] < _SERVER_PID:
            counts[e["name"]] += e["args"]["count"]
    return counts
