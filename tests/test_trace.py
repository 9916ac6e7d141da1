"""Events exported as a Chrome / Perfetto trace: schema, paired spans, counts."""

from __future__ import annotations

import json
import time
from collections import defaultdict

import numpy as np
import pytest

import labkv
from labkv.events import Event, to_trace
from labkv.widgets import monitor


def _check_schema_and_pairs(trace: dict) -> dict[str, int]:
    """Every event has the trace-event fields; per track, every B has its E (in
    order, never overlapping); the push/pull calls the rank spans stand for."""
    assert set(trace) >= {"traceEvents"}
    open_spans: dict[tuple, list] = defaultdict(list)
    last_ts: dict[tuple, float] = {}
    counts = {"push": 0, "pull": 0}
    for e in trace["traceEvents"]:
        assert {"ph", "ts", "pid", "tid", "name"} <= set(e), e
        assert isinstance(e["ts"], float | int), e
        if e["ph"] == "M":
            continue
        track = (e["pid"], e["tid"])
        if e["ph"] in "BE":
            assert e["ts"] >= last_ts.get(track, -1e300), f"time goes back on {track}: {e}"
            last_ts[track] = e["ts"]
        if e["ph"] == "B":
            assert not open_spans[track], f"a span begins inside another on {track}: {e}"
            open_spans[track].append(e)
            assert {"key", "bytes", "round", "count", "rank"} <= set(e["args"])
            if e["name"] in counts and e["pid"] < 1000:
                counts[e["name"]] += e["args"]["count"]
        elif e["ph"] == "E":
            begin = open_spans[track].pop()
            assert begin["name"] == e["name"] and begin["ts"] < e["ts"]
    assert not any(open_spans.values()), "a span never ended"
    return counts


def test_monitor_export_loads_pairs_up_and_counts_every_call(tmp_path):
    kv = labkv.create("local")
    mon = monitor(kv)  # throttled detail: most calls only counted by the bus
    try:
        kv.init(["a", "b"], [np.zeros(4), np.zeros(4)])
        for i in range(300):
            kv.push("a" if i % 3 else "b", np.ones(4))
            if i % 2:
                kv.pull("a")
        path = tmp_path / "run.json"
        counts = mon.export_trace(path)
        trace = json.loads(path.read_text())
    finally:
        mon.close()
    assert _check_schema_and_pairs(trace) == counts == {"push": 300, "pull": 150}
    assert counts["push"] == mon.model.counts["push"]
    assert counts["pull"] == mon.model.counts["pull"]
    detailed = [e for e in trace["traceEvents"] if e["ph"] == "B" and e["args"]["count"] == 1]
    assert any(e["name"] == "push" for e in detailed)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {"rank 0"}


def test_filters_by_key_and_rank(tmp_path):
    events = [
        Event(i, 100.0 + i, "s", "push", key, rank=rank, nbytes=8)
        for i, (key, rank) in enumerate([("a", 0), ("b", 0), ("a", 1), ("a", 1)])
    ]
    trace = to_trace(events, keys=["a"], ranks=[1])
    spans = [e for e in trace["traceEvents"] if e["ph"] == "B"]
    assert [(e["pid"], e["args"]["key"], e["args"]["round"]) for e in spans] == [
        (2, "a", 1),
        (2, "a", 2),
    ]
    assert _check_schema_and_pairs(to_trace(events)) == {"push": 4, "pull": 0}


def test_overlapping_events_of_one_track_still_pair_up():
    start = 50.0
    events = [  # three calls whose recorded spans overlap on rank 0's track
        Event(0, 51.0, "s", "pull", "w", extra={"start": start}),
        Event(1, 50.5, "s", "pull", "w", extra={"start": start + 0.1}),
        Event(2, 50.5, "s", "push", "w"),
    ]
    assert _check_schema_and_pairs(to_trace(events)) == {"push": 1, "pull": 2}


def _slow_rank_1(kv):
    for _ in range(4):
        if kv.rank == 1:
            time.sleep(0.05)
        kv.push("w", np.ones(4))
        kv.pull("w")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_dist_ssp_run_has_rank_and_server_tracks_and_waits(handle, tmp_path):
    from labkv.cluster import run

    kv = labkv.create("dist_ssp", cluster=handle, num_servers=1, staleness=0)
    mon = monitor(kv)
    try:
        kv.init("w", np.zeros(4))
        run(_slow_rank_1, num_workers=2, kvstore=kv, timeout=20)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the servers' and ranks' batches arrive
            mon.refresh()
            if mon.model.counts["pull"] >= 8 and mon.model.counts["clock"] >= 8:
                break
            time.sleep(0.1)
        time.sleep(0.3)
        counts = mon.export_trace(tmp_path / "ssp.json")
        trace = json.loads((tmp_path / "ssp.json").read_text())
    finally:
        mon.close()
        kv.close()
    assert _check_schema_and_pairs(trace) == counts == {"push": 8, "pull": 8}
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1", "server 0"}
    waits = [e for e in trace["traceEvents"] if e["ph"] == "B" and e["name"] == "clock"]
    fast = [e["args"]["waited_ms"] for e in waits if e["args"]["rank"] == 0]
    assert fast and max(fast) > 20  # rank 0 waited for the slow rank 1


def test_a_completed_sync_round_is_a_span_an_open_one_an_instant():
    events = [
        Event(0, 10.0, "s", "round", "w", server=0, extra={"round": 3, "waited_s": 0.0}),
        Event(
            1,
            12.0,
            "s",
            "round",
            "w",
            server=0,
            extra={"round": 3, "waited_s": 2.0, "complete": True},
        ),
    ]
    trace = to_trace(events)
    _check_schema_and_pairs(trace)
    shown = [(e["ph"], e["ts"]) for e in trace["traceEvents"] if e["name"] == "round"]
    assert shown == [("i", 0.0), ("B", 0.0), ("E", 2e6)]
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"rounds"}


def test_a_push_of_another_slice_does_not_count_as_a_new_push_of_the_key():
    # Server 0 holds slice 0 of "w" (first_piece) and server 1 slice 1: a rank's two
    # pushes reach both, and each server's receipt says which push of the key it is.
    events = []
    for i in range(2):
        for server in (0, 1):
            e = Event(len(events), 10.0 + i + server / 10, "s", "push", "w", server=server)
            e.first_piece = server == 0
            events.append(e)
    spans = [e for e in to_trace(events)["traceEvents"] if e["ph"] == "B"]
    assert [(e["pid"] - 1000, e["args"]["round"]) for e in spans] == [
        (0, 1),
        (1, 0),
        (0, 2),
        (1, 0),
    ]
