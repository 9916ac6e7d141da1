"""The monitor's counts read the same everywhere (course review, issue 29, items 22,
23 and 26): the header's calls are the keys table's, a server's bytes in say that
they hold the inits, a single call shows as one in the event log even for a
monitor started after earlier calls were only tallied, and a failover that lost
a primary's last reports marks the counts it made a lower bound."""

from __future__ import annotations

import time

import numpy as np
import pytest

import labkv
from labkv.events import Event
from labkv.widgets import MonitorModel, monitor
from labkv.widgets._eventlog import log_table
from labkv.widgets._legend import LEGEND, OPS_LEGEND, calls_line
from labkv.widgets._monitor import DETAIL_INTERVAL
from labkv.widgets._render.tables import keys_table, lost_note, servers_table
from tests._inprocess import InProcessCluster

FAILOVER = {"lost": ["tcp://a:1"], "replicas": ["tcp://b:2"], "primary": "tcp://b:2"}


def _column(table, name):
    headers, rows = table
    return [row[headers.index(name)] for row in rows]


def _cluster_stream(pushes_before=16, pushes_after=0, failover=True):
    """What a watched dist_sync store of one rank and one replicated server streams:
    per push one event on the rank and one on the server (with its updater call),
    the rank's failover, the server's byte counters (inits included)."""
    model = MonitorModel()
    store, seq = "dist_sync-x", iter(range(10_000))
    model.on_event(Event(next(seq), 0.0, store, "init", "w", shape=(2,), nbytes=8, server=0))
    for step in range(pushes_before + pushes_after + 1):
        if failover and step == pushes_before:
            model.on_event(Event(next(seq), 1.0, store, "failover", None, server=0,
                                 extra={**FAILOVER, "promoted": True}))  # fmt: skip
        if step == pushes_before + pushes_after:
            break
        model.on_event(Event(next(seq), 1.0, store, "push", "w", nbytes=8))
        model.on_event(Event(next(seq), 1.0, store, "push", "w", nbytes=8, server=0))
        model.on_event(Event(next(seq), 1.0, store, "optimizer", "w", server=0))
    sent = 8 + 8 * (pushes_before + pushes_after)
    model.on_event(Event(next(seq), 2.0, store, "load", None, server=0,
                         extra={"bytes_in": sent, "bytes_out": 0}))  # fmt: skip
    model.flush()
    return model


def test_the_headers_calls_are_the_keys_tables_though_a_cluster_reports_a_push_twice():
    model = _cluster_stream(pushes_before=5, failover=False)
    assert model.counts["push"] == 10  # events: the rank's and the server's
    table = keys_table(model)
    assert _column(table, "push") == ["5"] and _column(table, "updater") == ["5"]
    assert calls_line(model) == "push 5 · pull 0 · updater 5"
    # the legends define what the header and the events tab name
    assert "push once" in LEGEND and "events tab" in LEGEND and len(LEGEND) < 170  # a line
    for word in ("load:", "round:", "clock:", "update:", "optimizer:", "×3"):
        assert word in OPS_LEGEND, word


def test_a_servers_bytes_in_hold_the_inits_and_say_so():
    model = _cluster_stream(pushes_before=5, failover=False)
    headers, rows = servers_table(model)
    assert headers[2] == "bytes in (inits + pushes)" and rows[0][2] == "48 B"
    assert keys_table(model)[0][5:7] == ["pushed", "pulled"]
    assert _column(keys_table(model), "pushed") == ["40 B"]  # 48 B less the init's 8 B


def test_a_single_call_is_one_call_for_a_monitor_started_after_tallied_calls():
    """The review's recipe: a monitor attached, 5 pulls (the 5th only tallied), then a
    second monitor and one pull: its event stood for 2 calls (48 B) before."""
    kv = labkv.create("local")
    kv.init(3, np.zeros(3))  # 24 B
    first = monitor(kv)
    try:
        for _ in range(5):
            kv.pull(3)
        second = monitor(kv)
        try:
            time.sleep(DETAIL_INTERVAL)  # as between cells: the pull gets a detailed event
            kv.pull(3)
            first.refresh()
            second.refresh()
            assert first.model.keys[3].pulls == 6  # exact: the tallied pull came first
            assert second.model.keys[3].pulls == 1
            assert _column(keys_table(second.model), "pulled") == ["24 B"]
            (row,) = log_table(second.model, op="pull")[1]
            assert row[1] == "pull" and row[6] == "24 B"
        finally:
            second.close()
    finally:
        first.close()


def test_an_event_standing_for_tallied_calls_says_how_many():
    model = MonitorModel()
    model.on_event(Event(0, 0.0, "local", "pull", 3, nbytes=72, count=3))
    model.flush()
    (row,) = log_table(model)[1]
    assert row[1] == "pull ×3" and row[6] == "24 B each"
    assert model.keys[3].pulls == 3


def test_counts_a_failover_cut_short_are_marked_and_explained():
    model = _cluster_stream(pushes_before=16, pushes_after=0)
    table = keys_table(model, {"w": [{"server": 0}]})
    assert _column(table, "push") == ["16+"] and _column(table, "updater") == ["16+"]
    assert _column(table, "pull") == ["0"]  # a rank's own count: nothing lost
    assert calls_line(model) == "push 16+ · pull 0 · updater 16+"
    note = lost_note(model)
    assert "at least" in note and "server 0's primary tcp://a:1" in note
    # a key of another server lost nothing
    assert _column(keys_table(model, {"w": [{"server": 1}]}), "push") == ["16"]


def test_no_marks_without_a_failover_or_when_a_backup_was_lost():
    assert _column(keys_table(_cluster_stream(failover=False)), "push") == ["16"]
    model = MonitorModel()
    backup = {**FAILOVER, "promoted": False}  # the primary, and its reports, stay
    model.on_event(Event(0, 0.0, "dist_sync-x", "failover", None, server=0, extra=backup))
    model.flush()
    assert not model.lost_reports and lost_note(model) == ""


def test_a_real_failover_marks_the_dashboards_keys_and_header():
    pytest.importorskip("ipywidgets")
    pytest.importorskip("jupyter_bokeh")
    with InProcessCluster("dist_sync", 1, 1, 5.0, replicas=2) as c:
        (kv,) = c.ranks
        mon = monitor(kv)
        _ = mon.widget
        try:
            kv.init("w", np.zeros(3, np.float32))
            kv.set_optimizer("sgd", learning_rate=0.1)
            for step in range(10):
                if step == 5:
                    c.group.kill(0)
                kv.push("w", np.ones(3, np.float32))
            kv.flush()
            mon.refresh()
            d = mon.dashboard
            assert mon.model.counts["failover"] == 1
            assert list(mon.model.lost_reports) == [0]
            assert "server 0&#x27;s primary" in d.keys.value and "at least" in d.keys.value
            assert "push 10+ · " in d.header.value
            assert d.legend in mon.widget.children
        finally:
            mon.close()
