"""The cluster's logic without Dask: real ``Server`` objects on an asyncio loop in
this process, reached through the in-process link (``_inprocess.InProcessServers``),
driven by real ``DistStore`` ranks. Each test runs in milliseconds."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import labkv
from labkv.cluster._errors import ClusterError
from labkv.cluster._rank import holding as _holding
from tests._inprocess import InProcessCluster as Cluster
from tests._waiting import in_threads


@pytest.mark.parametrize("wire", [True, False], ids=["pickled", "by-reference"])
def test_a_sync_round_sums_every_rank_for_whole_and_sliced_keys(wire):
    with Cluster(bigarray_bound=8, wire=wire) as c:
        r0, r1 = c.ranks
        r0.init(["small", "big"], [np.zeros(3, np.float32), np.zeros(20, np.float32)])
        r1.init(["small", "big"], [np.zeros(3, np.float32), np.zeros(20, np.float32)])
        assert [p["server"] for p in r0.placement()["big"]] == [0, 1]  # sliced

        def step(kv, value):
            kv.push(["small", "big"], [np.full(3, value, np.float32), np.arange(20.0) * value])
            return kv.pull(["small", "big"])

        for got in in_threads(lambda: step(r0, 1.0), lambda: step(r1, 2.0)):
            np.testing.assert_array_equal(got[0], [3.0, 3.0, 3.0])
            np.testing.assert_array_equal(got[1], np.arange(20.0) * 3)


def test_a_pull_waits_for_the_round_its_push_joined():
    with Cluster(num_servers=1) as c:
        r0, r1 = c.ranks
        for kv in c.ranks:
            kv.init("w", np.zeros(2))
        r0.push("w", np.ones(2))
        pulled = []
        t = threading.Thread(target=lambda: pulled.append(r0.pull("w")))
        t.start()
        t.join(timeout=0.2)
        assert pulled == []  # rank 1 has not pushed: the round is open
        r1.push("w", np.full(2, 5.0))
        t.join(timeout=5)
        np.testing.assert_array_equal(pulled[0], [6.0, 6.0])
        np.testing.assert_array_equal(r1.pull("w"), [6.0, 6.0])


def test_a_round_that_never_completes_times_out_naming_the_missing_rank():
    with Cluster(num_servers=1, num_workers=3, timeout=0.3) as c:
        for kv in c.ranks:
            kv.init("w", np.zeros(2))
        c.ranks[0].push("w", np.ones(2))
        c.ranks[2].push("w", np.ones(2))
        with pytest.raises(ClusterError, match=r"ranks \[1\] have not pushed key 'w' in round 0"):
            c.ranks[0].pull("w")


def test_an_updater_error_reaches_each_rank_once_and_changes_nothing():
    def updater(key, grad, stored):
        raise ValueError("bad step")

    with Cluster(bigarray_bound=4) as c:
        r0, r1 = c.ranks
        for kv in c.ranks:
            kv.init("w", np.ones(8))
        r0.set_updater(updater)
        r1.set_updater(updater)
        r0.push("w", np.ones(8))
        r1.push("w", np.ones(8))
        for kv in c.ranks:
            with pytest.raises(ValueError, match="bad step"):
                kv.pull("w")
            np.testing.assert_array_equal(kv.pull("w"), np.ones(8))  # reported once


def _add(key, grad, stored):
    stored += grad


def test_dist_async_applies_each_push_at_once():
    with Cluster("dist_async") as c:
        r0, r1 = c.ranks
        for kv in c.ranks:
            kv.init("w", np.zeros(2))
            kv.set_updater(_add)
        r0.push("w", np.ones(2))
        np.testing.assert_array_equal(r0.pull("w"), [1.0, 1.0])  # rank 1 never pushed
        r1.push("w", np.ones(2))
        np.testing.assert_array_equal(r1.pull("w"), [2.0, 2.0])


def test_a_big_push_by_reference_is_staged_so_the_rank_may_reuse_its_buffer():
    n = 1 << 18  # 1 MiB of float32: waited for, lent to the server
    with Cluster(num_servers=1, wire=False) as c:
        r0, r1 = c.ranks
        for kv in c.ranks:
            kv.init("w", np.zeros(n, np.float32))
        grad = np.ones(n, np.float32)
        r0.push("w", grad)  # opens the round: the server keeps a staged copy
        grad[:] = -100.0
        assert sorted(c.servers[0].staging.buffers) == [("w", 0)]
        r1.push("w", np.full(n, 2.0, np.float32))
        np.testing.assert_array_equal(r0.pull("w")[:3], [3.0, 3.0, 3.0])


def test_small_pushes_ride_in_the_next_pull(monkeypatch):
    monkeypatch.setattr(_holding, "HOLD_S", 60.0)  # the timer never sends them first
    with Cluster(num_servers=1, num_workers=1) as c:
        (kv,) = c.ranks
        kv.init("w", np.zeros(2))
        kv.set_updater(_add)
        for _ in range(3):
            kv.push("w", np.ones(2))
        np.testing.assert_array_equal(kv.pull("w"), [3.0, 3.0])
        assert c.servers[0].reports.messages == {"push": 3, "pull": 1}
        kv.server_load()  # a call that is not a pull: nothing was left to send first
        assert c.servers[0].reports.messages == {"push": 3, "pull": 1}


def test_a_held_push_leaves_on_its_own_after_the_hold_time():
    with Cluster(num_servers=1, num_workers=1) as c:
        (kv,) = c.ranks
        kv.init("w", np.zeros(2))
        kv.push("w", np.ones(2))
        kv.flush()
        assert c.servers[0].reports.messages == {"push": 1, "pull": 0}
        np.testing.assert_array_equal(kv.peek("w"), [1.0, 1.0])


def test_a_call_to_a_lost_server_names_it():
    with Cluster(num_servers=2) as c:
        kv = c.ranks[0]
        kv.init("w", np.zeros(2))
        c.group.links[1].gone = True
        with pytest.raises(ClusterError, match="server 1 on Dask worker in-process is lost"):
            kv.server_load()


def test_optimizer_steps_match_the_local_store():
    opt = labkv.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    with Cluster(num_workers=1, bigarray_bound=4) as c:
        (kv,) = c.ranks
        local = labkv.create("local")
        for store in (kv, local):
            store.init("w", np.ones(10, np.float32))
            store.set_optimizer(opt)
        for step in range(3):
            for store in (kv, local):
                store.push("w", np.full(10, step + 1.0, np.float32))
        np.testing.assert_allclose(kv.pull("w"), local.pull("w"), rtol=1e-6)


def test_staleness_zero_waits_for_the_slowest_rank():
    with Cluster("dist_ssp", num_servers=1, staleness=0, timeout=0.3) as c:
        r0, r1 = c.ranks
        for kv in c.ranks:
            kv.init("w", np.zeros(1))
        r0.push("w", np.ones(1))
        with pytest.raises(ClusterError, match="slowest: rank 1 at clock 0"):
            r0.pull("w")
