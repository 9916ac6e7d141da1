"""The monitor's event model on real stores and on hand-made cluster events (no front end)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import labkv
from labkv.events import Event, EventBus
from labkv.widgets import MonitorModel, monitor
from labkv.widgets._clocks import clocks_grid, clocks_table
from labkv.widgets._eventlog import EventRows, log_row, log_table
from labkv.widgets._fanin import fanin_grid, fanin_note, fanin_table
from labkv.widgets._render.format import fmt_time
from labkv.widgets._render.html import table_html
from labkv.widgets._render.tables import keys_table, servers_table
from labkv.widgets._tracetable import trace_table

SHAPE = (2, 3)
HOSTILE = "<img src=x onerror=alert(1)>"


def run_tutorial(kv) -> None:
    """The MXNet KVStore tutorial's cells, on 4 simulated devices."""
    devs = labkv.devices(4)
    a = labkv.zeros(SHAPE)
    kv.init(3, labkv.ones(SHAPE) * 2)
    kv.pull(3, out=a)
    kv.push(3, labkv.ones(SHAPE) * 8)
    kv.pull(3, out=a)
    kv.push(3, [labkv.ones(SHAPE, device=d) for d in devs])
    kv.pull(3, out=a)

    def update(key, merged, stored):
        stored += merged * 2

    kv.set_updater(update)
    kv.pull(3, out=a)
    kv.push(3, labkv.ones(SHAPE))
    kv.pull(3, out=a)
    kv.pull(3, out=[labkv.ones(SHAPE, device=d) for d in devs])
    keys = [5, 7, 9]
    kv.init(keys, [labkv.ones(SHAPE)] * 3)
    kv.push(keys, [labkv.ones(SHAPE)] * 3)
    kv.pull(keys, out=[labkv.zeros(SHAPE) for _ in keys])
    kv.push(keys, [[labkv.ones(SHAPE, device=d) for d in devs] for _ in keys])
    kv.pull(keys, out=[[labkv.zeros(SHAPE, device=d) for d in devs] for _ in keys])


@pytest.mark.parametrize("kind", ["local", "device"])
def test_per_key_table_after_the_tutorial_is_exact(kind):
    kv = labkv.create(kind)
    mon = monitor(kv)
    run_tutorial(kv)
    model = mon.model
    mon.refresh()
    nb = 4 * 6  # float32 (2, 3)
    k3 = model.keys[3]
    assert (k3.inits, k3.pushes, k3.pulls, k3.updates) == (1, 3, 6, 1)
    assert k3.bytes_in == nb * (1 + 4 + 1)  # one push of 1, one of 4 devices, one of 1
    assert k3.bytes_out == nb * (5 + 4)  # five pulls into one array, one into four
    assert k3.value == pytest.approx({"min": 6, "max": 6, "mean": 6, "norm": 6 * 6**0.5})
    for key in (5, 7, 9):
        s = model.keys[key]
        assert (s.inits, s.pushes, s.pulls, s.updates) == (1, 2, 2, 2)
        assert s.bytes_in == nb * (1 + 4) and s.bytes_out == nb * (1 + 4)
        assert s.value["mean"] == 11  # 1 + 1*2 + 4*2
    assert model.counts == {"init": 4, "push": 9, "pull": 12, "update": 7}
    mon.close()
    assert not kv.events.active


def test_updater_trace_reads_as_the_tutorial_updater():
    kv = labkv.create("local")
    mon = monitor(kv)
    run_tutorial(kv)
    mon.refresh()
    headers, rows = trace_table(mon.model)
    assert [r[1] for r in rows] == ["9", "7", "5", "9", "7", "5", "3"]  # newest first
    assert {r[-1] for r in rows} == {"stored += input * 2"}
    first = rows[-1]  # key 3: stored 4, input 1 -> 6
    assert first[3:6] == ["1 (1..1)", "4 (4..4)", "6 (6..6)"]
    last = rows[0]  # key 9: stored 3, input 4 (summed over devices) -> 11
    assert last[3:6] == ["4 (4..4)", "3 (3..3)", "11 (11..11)"]
    mon.close()


def test_optimizer_steps_are_updater_calls():
    kv = labkv.create("local")
    mon = monitor(kv)
    kv.init("w", np.ones(4))
    kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.5))
    for _ in range(3):
        kv.push("w", np.ones(4))
    mon.refresh()
    stats = mon.model.keys["w"]
    assert (stats.pushes, stats.updates) == (3, 3)
    assert stats.value["mean"] == pytest.approx(1 - 3 * 0.5)
    rows = trace_table(mon.model)[1]
    assert rows[0][2] == "optimizer sgd" and rows[0][-1] == "stored += input * -0.5"
    mon.close()


def test_log_is_newest_first_filterable_and_bounded():
    model = MonitorModel(log_size=50)
    kv = labkv.create("local")
    kv.events.subscribe(model.on_event)
    kv.init(["a", "b"], [np.zeros(2), np.zeros(2)])
    for i in range(100):
        kv.push("a" if i % 2 else "b", np.ones(2))
    kv.pull("a")
    model.flush()
    assert len(model.log) == 50 and model.keys["a"].pushes == 50
    seqs = [e.seq for e in model.events(limit=10)]
    assert seqs == sorted(seqs, reverse=True)
    assert {e.key for e in model.events(key="a", limit=100)} == {"a"}
    assert [e.op for e in model.events(key="a", op="pull")] == ["pull"]
    headers, rows = log_table(model, op="push", limit=5)
    assert len(rows) == 5 and {r[1] for r in rows} == {"push"}


def test_failover_and_reseed_rows_say_what_changed_and_can_be_filtered():
    model = MonitorModel()
    bus = EventBus("s")
    bus.subscribe(model.on_event)
    bus.emit("push", "w", nbytes=8)
    lost = {"lost": ["tcp://a:1"], "replicas": ["tcp://b:2"], "primary": "tcp://b:2"}
    bus.emit("failover", None, server=0, extra={**lost, "promoted": True})
    bus.emit(
        "reseed",
        None,
        server=0,
        extra={"added": "tcp://c:3", "replicas": ["tcp://b:2", "tcp://c:3"]},
    )
    model.flush()
    (failover,) = log_table(model, op="failover")[1]
    assert failover[1] == "failover" and failover[-1] == (
        "lost tcp://a:1; replicas now tcp://b:2 (primary first)"
    )
    (reseed,) = log_table(model, op="reseed")[1]
    assert reseed[-1] == "seeded tcp://c:3; replicas now tcp://b:2, tcp://c:3 (primary first)"
    kv = labkv.create("local")
    mon = monitor(kv)
    _ = mon.widget  # the dashboard is made when first shown
    ops = [value for _, value in mon.dashboard.op_filter.options]
    assert {"failover", "reseed"} <= set(ops)
    mon.close()


def test_a_lost_replaced_or_dropped_rank_are_rows_that_say_where_and_can_be_filtered():
    model = MonitorModel()
    bus = EventBus("s")
    bus.subscribe(model.on_event)
    bus.emit("rank-lost", None, rank=1, extra={"worker": "tcp://a:1", "step": 6})
    replaced = {"worker": "tcp://b:2", "lost_worker": "tcp://a:1", "incarnation": 1}
    bus.emit("rank-replaced", None, rank=1, extra={**replaced, "step": 6, "seconds": 0.8})
    model.flush()
    (lost,) = log_table(model, op="rank-lost")[1]
    assert lost[3] == "1" and lost[-1] == "worker tcp://a:1 lost; resumes at step 6"
    (row,) = log_table(model, op="rank-replaced")[1]
    assert row[-1] == "replaced on tcp://b:2 (incarnation 1) at step 6, placed in 0.8 s"
    bus.emit("rank-dropped", None, rank=0, extra={"worker": "tcp://c:3", "ranks_left": 1})
    model.flush()
    (dropped,) = log_table(model, op="rank-dropped")[1]
    assert dropped[3] == "0"
    assert (
        dropped[-1]
        == "worker tcp://c:3 lost at the start; the run goes on without it (1 rank left)"
    )
    kv = labkv.create("local")
    mon = monitor(kv)
    _ = mon.widget
    ops = [value for _, value in mon.dashboard.op_filter.options]
    assert {"rank-lost", "rank-replaced", "rank-dropped"} <= set(ops)
    mon.close()


def test_pending_events_stay_bounded_without_a_flush():
    model = MonitorModel(max_pending=100)
    bus = EventBus("s")
    bus.subscribe(model.on_event)
    for _ in range(1050):
        bus.emit("push", "k", nbytes=8)
        assert model.pending < 100
    model.flush()
    assert model.keys["k"].pushes == 1050 and model.keys["k"].bytes_in == 8 * 1050


def test_events_from_a_background_thread_are_counted_exactly():
    kv = labkv.create("local")
    mon = monitor(kv)
    kv.init(["a", "b"], [np.zeros(3), np.zeros(3)])

    def worker(key):
        for _ in range(300):
            kv.events.deliver(Event(0, 0.0, "cluster", "push", key, rank=1, server=0, nbytes=4))

    threads = [threading.Thread(target=worker, args=(k,)) for k in "ab"]
    for t in threads:
        t.start()
    for _ in range(50):
        kv.push("a", np.ones(3))
    for t in threads:
        t.join()
    mon.refresh()
    assert mon.model.keys["a"].pushes == 350 and mon.model.keys["b"].pushes == 300
    assert mon.model.servers[0].bytes_in == 600 * 4  # derived from push events naming server 0
    mon.close()


def _round(key, server, rnd, pushed, workers, complete=False, waited=0.5, t=100.0):
    missing = [r for r in range(workers) if r not in pushed]
    extra = {
        "round": rnd,
        "pushed": list(pushed),
        "missing": [] if complete else missing,
        "num_workers": workers,
        "waited_s": waited,
        "complete": complete,
    }
    return Event(0, t, "dist_sync", "round", key, server=server, extra=extra)


def test_fanin_grid_shows_the_rank_held_back_as_missing():
    model = MonitorModel()
    for ev in (
        _round("w", 0, 4, [0, 1], 3),  # rank 2 has not pushed key w's slice on server 0
        _round("w", 1, 4, [0, 1, 2], 3),
        _round("b", 1, 4, [0, 1, 2], 3, complete=True),
    ):
        model.on_event(ev)
    model.flush()
    headers, rows = fanin_table(model)
    assert headers == ["key", "round", "waited", "state", "rank 0", "rank 1", "rank 2"]
    # a waiting round says since when (100 s, less the 0.5 s it had waited), not for how long
    since = f"since {fmt_time(99.5)}"
    assert rows[0] == ["w", "4", since, "waiting for 1", "pushed", "pushed", "MISSING"]
    assert rows[1] == ["b", "4", "0.5 s", "complete", "pushed", "pushed", "pushed"]
    assert fanin_note(model, now=102.0) == (
        "1 of 2 keys waiting, the oldest for 2.5 s: rank 2 missing on 1 key"
    )
    html = table_html(headers, rows, "labkv-fanin")
    assert '<td class="labkv-missing">MISSING</td>' in html
    model.on_event(_round("w", 0, 4, [0, 1, 2], 3, complete=True, t=103.0))
    model.on_event(_round("w", 1, 4, [0, 1, 2], 3, complete=True, t=103.0))
    model.flush()
    assert fanin_table(model)[1][0][3:] == ["complete", "pushed", "pushed", "pushed"]
    assert fanin_note(model, now=110.0) == "every round complete (2 keys)"
    model.on_event(_round("w", 0, 5, [2], 3, t=111.0))  # next round started on one server
    model.flush()
    assert fanin_table(model)[1][0][1:] == [
        "5",
        f"since {fmt_time(110.5)}",
        "waiting for 2",
        "MISSING",
        "MISSING",
        "pushed",
    ]


def test_the_fanin_line_names_the_rank_that_holds_many_keys_up():
    model = MonitorModel()
    workers, keys = 64, 500
    for k in range(keys):  # rank 17 has not pushed every 12th key; the others are complete
        pushed = [r for r in range(workers) if r != 17 or k % 12]
        model.on_event(_round(k, 0, 9, pushed, workers, complete=len(pushed) == workers))
    model.flush()
    held = sum(1 for k in range(keys) if k % 12 == 0)
    assert fanin_note(model, now=112.5) == (
        f"{held} of {keys} keys waiting, the oldest for 13 s: rank 17 missing on {held} keys"
    )
    # the dashboard's grid: the waiting keys first, rank 17's column and the others in one
    headers, rows, caption = fanin_grid(model)
    assert headers == ["key", "round", "waited", "state", "rank 17", "other ranks"]
    assert len(rows) == 20 and {r[0] for r in rows} <= {str(k) for k in range(0, keys, 12)}
    assert all(r[3:] == ["waiting for 1", "MISSING", "63 pushed"] for r in rows)
    assert caption.startswith(f"20 of {keys} keys shown, the {held} waiting first")
    html = table_html(headers, rows, "labkv-fanin")
    full = table_html(*fanin_table(model), "labkv-fanin")
    assert len(html) < 5_000 < 500_000 < len(full)  # all 500 x 64 cells: what it was


def test_server_load_from_load_events():
    model = MonitorModel()
    for t, (bin_, bout) in enumerate([(100, 0), (300, 50), (700, 150)]):
        for server in (0, 1):
            extra = {
                "bytes_in": bin_ * (server + 1),
                "bytes_out": bout,
                "keys": 2,
                "bytes_held": 64,
                "device": f"gpu({server})" if server else "cpu(0)",
            }
            model.on_event(
                Event(t, float(t), "dist_sync", "load", None, server=server, extra=extra)
            )
    # push events naming a server that reports its own counters do not add to them
    model.on_event(Event(9, 9.0, "dist_sync", "push", "w", server=0, nbytes=10_000))
    model.flush()
    rows = servers_table(model)[1]
    assert rows == [
        ["0", "cpu(0)", "700 B", "150 B", "2", "64 B"],
        ["1", "gpu(1)", "1.4 KiB", "150 B", "2", "64 B"],
    ]
    assert [h[1] for h in model.servers[1].history] == [200, 600, 1400]
    assert "load" not in {e.op for e in model.log}  # load ticks do not crowd the event log


def test_the_server_table_names_each_replica_and_the_primary():
    model = MonitorModel()
    replicas = ["tcp://10.0.0.2:1", "tcp://10.0.0.3:1"]
    extra = {"bytes_in": 8, "bytes_out": 8, "keys": 1, "bytes_held": 8, "replicas": replicas}
    model.on_event(Event(0, 0.0, "dist_sync", "load", None, server=0, extra=extra))
    # after a failover the next load names the new primary first
    extra = {**extra, "replicas": replicas[::-1]}
    model.on_event(Event(1, 1.0, "dist_sync", "load", None, server=0, extra=extra))
    model.flush()
    headers, rows = servers_table(model)
    assert headers[-1] == "replicas (primary first)"
    assert rows[0][-1] == "tcp://10.0.0.3:1 (primary), tcp://10.0.0.2:1"


def test_hostile_key_names_are_escaped_in_html():
    kv = labkv.create("local")
    mon = monitor(kv)
    kv.init(HOSTILE, np.zeros(3))
    kv.push(HOSTILE, np.ones(3))
    mon.refresh()
    for headers, rows in (keys_table(mon.model), log_table(mon.model)):
        html = table_html(headers, rows, "x")
        assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert HOSTILE in str(mon)  # the text rendering shows it as it is
    mon.close()


def test_tables_redrawn_from_their_caches_match_a_fresh_drawing():
    # A live view redraws from rows made and drawn last time; what it shows must be
    # exactly what drawing from scratch shows, as events arrive and leave the table.
    kv = labkv.create("local")
    mon = monitor(kv)
    kv.init([HOSTILE, "w"], [np.zeros(3), np.zeros(2)])
    made, drawn = EventRows(log_row), {}
    for step in range(6):
        kv.push(HOSTILE if step % 2 else "w", np.full(3 if step % 2 else 2, step))
        mon.refresh()
        headers, rows = log_table(mon.model, limit=4, cache=made)
        assert (headers, rows) == log_table(mon.model, limit=4)
        html = table_html(headers, rows, "labkv-log", cache=drawn)
        assert html == table_html(headers, rows, "labkv-log")
        assert len(drawn) == len(rows) == min(4, 3 + step)  # only the rows shown are kept
        assert "<img" not in html
    events = mon.model.events(limit=4)
    again = made.rows(events)
    assert all(a is b for a, b in zip(again, made.rows(events), strict=True))  # made once
    mon.close()


def test_text_summary_without_a_front_end():
    kv = labkv.create("local")
    mon = monitor(kv)
    run_tutorial(kv)
    text = mon.summary(events=3)
    assert text.startswith(
        "labkv monitor local: push 9, pull 12, updater 7; 32 events (init 4, pull 12, push 9, update 7)"
    )
    assert "stored += input * 2" in text and "cpu(0)" in text
    assert str(mon) == mon.summary() and "watching" in repr(mon)
    mon.close()
    assert "closed" in repr(mon)


def test_reattach_to_a_new_store_forgets_the_old_one():
    kv1, kv2 = labkv.create("local"), labkv.create("local")
    mon = monitor(kv1)
    kv1.init(1, np.zeros(2))
    mon.attach(kv2)
    kv1.push(1, np.ones(2))
    kv2.init(2, np.zeros(2))
    mon.refresh()
    assert list(mon.model.keys) == [2] and not kv1.events.active
    mon.close()
    assert not kv2.events.active


def test_a_sliced_key_keeps_its_shape_and_is_read_from_its_servers():
    model = MonitorModel()
    model.on_event(Event(0, 1.0, "dist_sync", "init", "w", shape=(16,), dtype="float32"))
    for server in (0, 1):  # each server reports the push of its own slice
        model.on_event(
            Event(0, 2.0, "dist_sync", "push", "w", server=server, shape=(8,), nbytes=32)
        )
    model.flush()
    stats = model.keys["w"]
    assert stats.shape == (16,) and stats.on_servers
    assert model.take_server_changed(8) == ["w"] and model.take_server_changed(8) == []


def test_the_log_is_in_time_order_whatever_the_arrival_order():
    model = MonitorModel()
    model.on_event(Event(5, 3.0, "dist_sync", "pull", "w"))  # the notebook's, at once
    for seq, t in ((91, 1.0), (92, 2.0)):  # a server's batch, a moment later
        model.on_event(Event(seq, t, "dist_sync", "round", "w", server=0))
    model.flush()
    assert [e.time for e in model.events()] == [3.0, 2.0, 1.0]


def test_counted_calls_and_finished_rounds_mark_the_value_for_a_new_read():
    model = MonitorModel()
    model.on_event(Event(0, 1.0, "dist_sync", "init", "w", shape=(4,), dtype="float32"))
    model.flush()
    model.take_changed()
    model.on_event(Event(0, 2.0, "dist_sync", "update", "w", server=0, count=3, tally=True))
    model.flush()
    assert model.take_changed() == {"w"}  # only counted, but the value changed
    done = {"round": 4, "pushed": [0, 1], "missing": [], "num_workers": 2, "complete": True}
    model.on_event(Event(1, 3.0, "dist_sync", "round", "w", server=0, extra=done))
    model.flush()
    assert model.take_changed() == {"w"}  # the round's update is applied now


def test_the_clocks_panel_of_many_ranks_shows_the_slowest_and_the_waiters():
    model = MonitorModel()
    for key in range(500):  # rank 17 behind on every key; rank 3's pulls waited for it
        clocks = [12] * 64
        clocks[17] = 7 + key % 3
        model.on_event(
            Event(
                0,
                1.0,
                "dist_ssp",
                "clock",
                key,
                rank=3,
                server=0,
                extra={"clocks": clocks, "staleness": 4, "waited_s": 0.25},
            )
        )
    model.flush()
    headers, rows, caption = clocks_grid(model)
    assert headers[4:] == ["rank 3", "rank 17", "other ranks"]
    assert len(rows) == 20 and all(r[3] == "5" for r in rows)  # the widest spread first
    assert all(r[2] == "rank 17" and r[5].endswith("SLOWEST") for r in rows)
    assert rows[0][4] == "12 · waited 0.25 s (last 0.25 s)"
    assert rows[0][6] == "62 at clock 12, waited 0.00 s"
    assert caption.startswith("20 of 500 keys shown")
    small = table_html(headers, rows, "labkv-clocks")
    assert len(small) < 6_000 < 300_000 < len(table_html(*clocks_table(model), "labkv-clocks"))


def test_a_late_batch_does_not_turn_back_a_keys_last_change():
    # a notebook's init reaches a scheduler-side model after the servers' pushes
    model = MonitorModel()
    model.on_event(Event(0, 5.0, "dist_sync", "push", "w", server=0, nbytes=8))
    model.on_event(Event(1, 1.0, "dist_sync", "init", "w"))
    model.flush()
    stats = model.keys["w"]
    assert (stats.last_op, stats.last_change) == ("push", 5.0)
