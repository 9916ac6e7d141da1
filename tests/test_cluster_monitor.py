"""The monitor on a real dist_sync store: server events counted once, fan-in while a rank lags."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import numpy as np
import pytest

import labkv
import labkv.sparse as sparse
from labkv.cluster import ClusterError, run
from labkv.cluster._event_relay import topic_of
from labkv.widgets import monitor
from labkv.widgets._render.tables import fanin_table
from tests._waiting import wait_until


def _push_three_times(kv):
    for _ in range(3):
        kv.push("w", np.ones(16, dtype=np.float32))
    return kv.pull("w")


def _lagging_rank(kv, delay):
    if kv.rank == 1:
        time.sleep(delay)
    kv.push("w", np.ones(16, dtype=np.float32))
    return kv.pull("w")


def _settled(mon, key, done):
    """``key``'s stats once ``done(stats)`` holds and later batches had time to
    arrive (they must not add to the counts)."""

    def reached():
        mon.refresh()
        stats = mon.model.keys.get(key)
        return stats is not None and done(stats)

    assert wait_until(reached), mon.summary()
    time.sleep(0.4)
    mon.refresh()
    return mon.model.keys[key]


def test_sliced_key_pushes_are_counted_once_per_rank_push(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2, bigarray_bound=8)
    mon = monitor(kv)
    try:
        kv.init("w", np.zeros(16, dtype=np.float32))
        assert len(kv.placement()["w"]) == 2  # really sliced over both servers
        results = run(_push_three_times, num_workers=2, kvstore=kv)
        np.testing.assert_array_equal(results[0], np.full(16, 2.0))
        assert _settled(mon, "w", lambda stats: stats.pushes == 6).pushes == 6
        loads = mon.model.servers
        assert set(loads) == {0, 1} and all(s.bytes_in > 0 for s in loads.values())
    finally:
        mon.close()


def _rows_each_way(kv, rows, width, calls):
    grad = sparse.row_sparse_array((np.ones((len(rows), width), np.float32), rows), (2000, width))
    for _ in range(calls):
        kv.push("e", grad)
        kv.row_sparse_pull("e", out=sparse.zeros("row_sparse", (2000, width)), row_ids=rows)


def test_a_row_sparse_key_on_two_servers_shows_the_bytes_it_pushed(handle):
    """Review 2026-12-04 (b)8: the keys table showed one server's piece of a push of
    a row-sparse key cut over 2 servers, about half its bytes. Pushes and pulls of the
    same rows move the same bytes (values and int64 ids), which the servers counted."""
    rows, width, calls = np.arange(0, 2000, 7), 8, 2
    per_call = len(rows) * (width * 4 + 8)
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2)
    mon = monitor(kv)
    try:
        kv.init("e", sparse.zeros("row_sparse", (2000, width), dtype="float32"))
        assert len(kv.placement()["e"]) == 2  # cut over both servers
        before = kv.server_load()
        run(_rows_each_way, num_workers=2, kvstore=kv, args=(rows, width, calls))
        after = kv.server_load()
        received = sum(a["bytes_in"] - b["bytes_in"] for a, b in zip(after, before))
        assert received == 2 * calls * (per_call + len(rows) * 8)  # pushes, and pulls' ids
        stats = _settled(mon, "e", lambda s: s.pushes == 2 * calls and s.pulls == 2 * calls)
        assert stats.bytes_in == stats.bytes_out == 2 * calls * per_call
    finally:
        mon.close()
        kv.close()


def test_fanin_grid_shows_the_lagging_rank_missing(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=1)
    mon = monitor(kv)
    try:
        kv.init("w", np.zeros(16, dtype=np.float32))
        done = {}
        worker = threading.Thread(
            target=lambda: done.setdefault("r", run(_lagging_rank, 2, kvstore=kv, args=(3.0,)))
        )
        worker.start()

        def rank1_missing():
            mon.refresh()
            rows = fanin_table(mon.model)[1]
            return any(r[0] == "w" and r[-1] == "MISSING" and r[-2] == "pushed" for r in rows)

        assert wait_until(rank1_missing, 20.0), mon.summary()
        worker.join(60)
        np.testing.assert_array_equal(done["r"][1], np.full(16, 2.0))

        def complete():
            mon.refresh()
            rows = fanin_table(mon.model)[1]
            return any(r[0] == "w" and r[3] == "complete" for r in rows)

        assert wait_until(complete), mon.summary()
    finally:
        mon.close()


def test_peek_reads_without_events_while_ranks_run(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2, bigarray_bound=8)
    kv.init("w", np.zeros(16, dtype=np.float32))
    seen = []
    with kv.events.subscribe(seen.append):
        np.testing.assert_array_equal(kv.peek("w"), np.zeros(16))
    assert [e.op for e in seen] == []  # a peek is not a pull
    reads, stop = [], threading.Event()

    def keep_peeking():  # what a monitor's refresh thread does while the ranks run
        while not stop.is_set():
            reads.append(float(kv.peek("w")[0]))

    reader = threading.Thread(target=keep_peeking)
    reader.start()
    try:
        results = run(_push_three_times, num_workers=2, kvstore=kv)
    finally:
        stop.set()
        reader.join(30)
    np.testing.assert_array_equal(results[1], np.full(16, 2.0))
    assert reads and set(reads) <= {0.0, 2.0}
    np.testing.assert_array_equal(kv.peek("w"), np.full(16, 2.0))


def _pull_often(kv, pulls):
    kv.push("w", np.ones(16, dtype=np.float32))
    out = np.empty(16, dtype=np.float32)
    for _ in range(pulls):
        kv.pull("w", out=out)
    return out


def test_ranks_pulls_reach_the_monitor_counted_exactly(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=1)
    mon = monitor(kv)
    try:
        kv.init("w", np.zeros(16, dtype=np.float32))
        # 200 pulls per rank: most only counted on the rank (4 detailed per 100 ms).
        results = run(_pull_often, num_workers=2, kvstore=kv, args=(200,))
        np.testing.assert_array_equal(results[1], np.full(16, 2.0))
        stats = _settled(mon, "w", lambda stats: stats.pulls == 400)
        assert (stats.pulls, stats.pushes) == (400, 2)  # pushes: counted by the server only
        assert stats.bytes_out == 400 * 64
        # by op: the pushes came first, and a slow machine's many detailed pulls
        # would push them out of the newest events of the key
        rank_views = {
            (e.rank, e.op)
            for op in ("push", "pull")
            for e in mon.model.events(key="w", op=op, limit=1000)
            if e.server is None
        }
        assert {(0, "push"), (1, "push"), (0, "pull"), (1, "pull")} <= rank_views
    finally:
        mon.close()
        kv.close()


def test_unwatched_ranks_send_no_events(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=1)
    try:
        kv.init("w", np.zeros(16, dtype=np.float32))
        run(_pull_often, num_workers=2, kvstore=kv, args=(5,))
        time.sleep(0.3)  # longer than a flush interval: a stray batch would be there
        assert handle.client.get_events(topic_of(kv.store_id)) == ()
    finally:
        kv.close()


def _accumulate(key, merged, stored):
    stored[0] += merged[0]


def _push_and_pull_steps(kv, steps):
    for _ in range(steps):
        kv.push("acc", np.array([1.0, 0, 0, 0], np.float32))
        kv.pull("acc")


def test_values_follow_the_servers_without_a_pull_from_the_notebook(handle):
    pytest.importorskip("ipywidgets")
    kv = labkv.create("dist_sync", cluster=handle, num_servers=1)
    mon = monitor(kv)
    try:
        kv.init("acc", np.zeros(4, np.float32))
        kv.set_updater(_accumulate)
        _ = mon.widget  # the dashboard's value view too
        run(_push_and_pull_steps, num_workers=2, kvstore=kv, args=(20,))
        # the ranks' 20 rounds of 2 pushes, applied on the server: 40. The notebook
        # does not pull; the table shows what the server holds, not an early sample.
        stats = _settled(mon, "acc", lambda s: s.updates == 20 and s.value["max"] == 40.0)
        assert (stats.value["max"], stats.value["mean"]) == (40.0, 10.0)
        assert mon.model.updates_detailed < 20  # most calls were only counted
        trace = mon.summary(events=20)
        assert f"{mon.model.updates_detailed} of 20 calls shown" in trace, trace
        assert wait_until(lambda: mon.value is not None and mon.value[1].max() == 40.0)
        np.testing.assert_array_equal(kv.pull("acc"), [40, 0, 0, 0])
    finally:
        mon.close()
        kv.close()


def test_events_from_all_sources_are_newest_first_by_time(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=1)
    mon = monitor(kv)
    try:
        kv.init("acc", np.zeros(4, np.float32))
        run(_push_and_pull_steps, num_workers=2, kvstore=kv, args=(3,))
        _settled(mon, "acc", lambda s: s.pushes == 6)
        events = mon.model.events(limit=500)
        assert {e.server for e in events} >= {None, 0}  # the ranks' and the server's
        times = [e.time for e in events]
        assert times == sorted(times, reverse=True)
    finally:
        mon.close()
        kv.close()


def _watched_pair(handle):
    """A dist_sync store with keys 0 and 1 on servers 0 and 1, pushed once, and
    its monitor's dashboard showing them."""
    pytest.importorskip("ipywidgets")
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2, timeout=20)
    mon = monitor(kv, hz=20)
    _ = mon.widget
    kv.init([0, 1], [np.zeros(3, np.float32), np.zeros(5, np.float32)])
    kv.push([0, 1], [np.ones(3, np.float32), np.ones(5, np.float32)])
    _settled(mon, 1, lambda stats: stats.pushes == 1)
    return kv, mon


def test_closing_the_monitor_of_a_closed_store_keeps_its_picture(handle):
    kv, mon = _watched_pair(handle)
    kv.close()
    mon.close()  # a closed store has nothing left to stop: closing the monitor is quiet
    d = mon.dashboard
    assert "dist_sync (closed): push 2 · pull 0 · " in d.header.value  # calls, as the keys table
    assert "push 4" in d.header.value  # events (the ranks' and the servers'), in the tooltip
    assert "<td>0</td><td>3</td><td>1</td>" in d.keys.value
    assert not mon._ticker.running and not kv.events.active


def _kill_this_worker():
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.slow
def test_closing_the_monitor_after_a_server_is_lost():
    from labkv.cluster import connect

    # A cluster of its own, closed after: the session cluster's tests need not wait
    # for the nanny to bring the killed worker back (which once took over 60 s there).
    handle = connect(n_workers=2, dashboard_address=":0", memory_limit="1GiB", set_as_default=False)
    kv, mon = _watched_pair(handle)
    victim = kv.placement()[1][0]["device"].split("@")[1]
    try:
        with contextlib.suppress(Exception):  # the worker dies while answering
            handle.client.run(_kill_this_worker, workers=[victim])

        def lost():
            try:
                kv.peek(1)
            except ClusterError:
                return True
            return False

        assert wait_until(lost, 30.0)
        mon.close()
        d = mon.dashboard
        assert "dist_sync (closed; server 1 lost): " in d.header.value
        assert "<td>1</td><td>5</td><td>1</td>" in d.keys.value  # the last picture stays
        assert not mon._ticker.running and not kv.events.active
    finally:
        with contextlib.suppress(Exception):
            kv.close()
        handle.close()
