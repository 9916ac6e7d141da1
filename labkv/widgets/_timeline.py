"""The last seconds of the events as bars, one row per track: what the
monitor's timeline plot draws (the same tracks and spans as a trace export,
:mod:`labkv.events._trace`), with the newest event at 0 s.

>>> from labkv.events import Event
>>> from labkv.widgets._model.monitor_model import MonitorModel
>>> m = MonitorModel()
>>> m.on_event(Event(0, 10.0, "s", "push", "w", rank=1, extra={"start": 9.5}))
>>> m.on_event(Event(1, 10.0, "s", "clock", "w", rank=0, server=0, extra={"waited_s": 0.4}))
>>> _ = m.flush()
>>> tracks, bars = timeline_bars(m)
>>> tracks
['rank 1 · calls', 'server 0 · waits of rank 0']
>>> [(t, op, round(left, 2), right) for t, op, left, right in zip(
...     bars["track"], bars["op"], bars["left"], bars["right"])]
[('rank 1 · calls', 'push', -0.5, 0.0), ('server 0 · waits of rank 0', 'clock', -0.4, 0.0)]
"""

from __future__ import annotations

from typing import Any

from ..events import per_key
from ..events._trace import to_trace
from ._model.monitor_model import MonitorModel

__all__ = ["MAX_BARS", "MAX_TRACKS", "OP_COLORS", "fold_tracks", "timeline_bars", "timeline_view"]

#: the tracks the timeline draws at most: past it, all the servers' and the slowest
#: ranks' tracks, the other ranks' folded into one (72 tracks in 260 px were a smear)
MAX_TRACKS = 16

#: the spans the timeline draws at most (the newest, the waits first): a span costs
#: about 50 us to make and 110 bytes to send, and a busy 64-rank run's last 5 s held
#: 20,000 of them (a second of CPU and 2 MB a refresh)
MAX_BARS = 1000

#: bar colour per op; a dist_ssp pull's wait (``clock``) and a dist_sync round (from its
#: first push to its last) stand out in red
OP_COLORS = {
    "push": "#1f77b4",
    "pull": "#2ca02c",
    "update": "#ff7f0e",
    "optimizer": "#ff7f0e",
    "clock": "#d62728",
    "round": "#d62728",
    "init": "#7f7f7f",
    "barrier": "#9467bd",
}
COLUMNS = ("track", "left", "right", "op", "key", "bytes", "round", "waited_ms", "color")


def timeline_bars(
    model: MonitorModel, key: Any = None, seconds: float = 5.0
) -> tuple[list[str], dict[str, list]]:
    """``(tracks, columns)``: the track names, top to bottom, and one bar per span
    of the events of the last ``seconds`` before the newest (only ``key``'s when
    given): its track, ``left``/``right`` in seconds relative to the newest
    event, op, key, bytes, round, ``waited_ms`` (a wait's) and colour."""
    tracks, columns, _ = timeline_view(model, key, seconds, None)
    return tracks, columns


def timeline_view(
    model: MonitorModel, key: Any = None, seconds: float = 5.0, most: int | None = MAX_BARS
) -> tuple[list[str], dict[str, list], int]:
    """:func:`timeline_bars` of at most ``most`` spans: the newest waits (dist_sync
    rounds, dist_ssp waits; half of them at most), then the newest other spans;
    and how many spans there were in all.

    >>> from labkv.events import Event
    >>> m = MonitorModel()
    >>> for i in range(10):
    ...     m.on_event(Event(i, 10.0 + i / 10, "s", "push", "w", extra={"start": 9.0}))
    >>> m.on_event(Event(0, 10.0, "s", "clock", "w", rank=1, server=0, extra={"waited_s": 0.4}))
    >>> _ = m.flush()
    >>> tracks, bars, total = timeline_view(m, most=4)
    >>> total, bars["op"].count("clock"), len(bars["op"])
    (11, 1, 4)
    """
    with model.lock:
        newest = max((e.time for e in list(model.timeline)[-200:]), default=0.0)
        recent = []
        for e in reversed(model.timeline):
            if e.time < newest - seconds - 1.0:  # 1 s slack: batches arrive out of order
                break
            recent.append(e)
    since = newest - seconds
    recent = [e for r in recent if r.time >= since for e in per_key(r) if key in (None, e.key)]
    total = len(recent)
    if most is not None and total > most:  # newest first: keep the newest waits and others
        waits = [e for e in recent if e.op in ("clock", "round")][: most // 2]
        kept = {id(e) for e in waits}
        others = [e for e in recent if id(e) not in kept][: most - len(waits)]
        kept.update(id(e) for e in others)
        recent = [e for e in recent if id(e) in kept]
    trace = to_trace(reversed(recent))
    t0 = trace["otherData"]["start_time"]
    processes, threads = {}, {}
    columns: dict[str, list] = {c: [] for c in COLUMNS}
    begun: dict[tuple[int, int], dict] = {}
    for e in trace["traceEvents"]:
        ph, track = e["ph"], (e["pid"], e["tid"])
        if ph == "M":
            if e["name"] == "process_name":
                processes[e["pid"]] = e["args"]["name"]
            elif e["name"] == "thread_name":
                threads[track] = e["args"]["name"]
        elif ph == "B":
            begun[track] = e
        elif ph == "E":
            b = begun.pop(track)
            args = b["args"]
            columns["track"].append(track)
            columns["left"].append(max(b["ts"] / 1e6 + t0 - newest, -seconds))
            columns["right"].append(e["ts"] / 1e6 + t0 - newest)
            columns["op"].append(e["name"])
            columns["key"].append(args["key"])
            columns["bytes"].append(args["bytes"])
            columns["round"].append(args["round"])
            columns["waited_ms"].append(args.get("waited_ms", 0.0))
            columns["color"].append(OP_COLORS.get(e["name"], "#8c564b"))
    names = {t: f"{processes[t[0]]} · {threads[t]}" for t in threads}
    columns["track"] = [names[t] for t in columns["track"]]
    return [names[t] for t in sorted(names)], columns, total


def fold_tracks(
    tracks: list[str], columns: dict[str, list], most: int = MAX_TRACKS
) -> tuple[list[str], dict[str, list]]:
    """``(tracks, columns)`` of :func:`timeline_bars` with at most ``most`` tracks:
    every server's, the ranks' whose spans last longest in all (the slowest), and
    the other ranks' in one track per kind (``12 other ranks · calls``).

    >>> tracks = [f"rank {r} · calls" for r in range(5)] + ["server 0 · receipts"]
    >>> columns = {"track": tracks, "left": [-1.0, -2.0, -3.0, -1.0, -1.0, -1.0],
    ...     "right": [0.0] * 6}
    >>> folded, cols = fold_tracks(tracks, columns, most=4)
    >>> folded, cols["track"][:2]
    (['rank 1 · calls', 'rank 2 · calls', 'server 0 · receipts', '3 other ranks · calls'], ['3 other ranks · calls', 'rank 1 · calls'])
    """
    if len(tracks) <= most:
        return tracks, columns
    rank_of = {t: t.split(" · ")[0] for t in tracks if t.startswith("rank ")}
    kinds = sorted({t.split(" · ", 1)[1] for t in rank_of})
    servers = [t for t in tracks if t not in rank_of]
    took: dict[str, float] = {}
    for track, left, right in zip(columns["track"], columns["left"], columns["right"]):
        if track in rank_of:
            took[rank_of[track]] = took.get(rank_of[track], 0.0) + right - left
    ranks = sorted(set(rank_of.values()), key=lambda r: (-took.get(r, 0.0), r))
    room = max(most - len(servers) - len(kinds), 1)
    per_rank = max(len(kinds), 1)
    kept = set(ranks[: max(room // per_rank, 1)])
    others = len(set(ranks) - kept)
    label = {
        t: t if rank_of[t] in kept else f"{others} other ranks · {t.split(' · ', 1)[1]}"
        for t in rank_of
    }
    names = [t for t in tracks if t in servers or rank_of[t] in kept]
    names += [f"{others} other ranks · {kind}" for kind in kinds]
    folded = dict(columns)
    folded["track"] = [label.get(t, t) for t in columns["track"]]
    return names, folded
