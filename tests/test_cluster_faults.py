"""Waits that end: missing ranks, killed workers, barrier reuse, bad input."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import numpy as np
import pytest

import labkv
from labkv.cluster import ClusterError, run
from labkv.cluster._runtime.launch import start_servers
from tests._waiting import server_tasks, wait_until


def _rank1_never_pushes(kv):
    kv.init(0, np.zeros(2))
    if kv.rank == 0:
        kv.push(0, np.ones(2))
        return kv.pull(0)
    return None


def test_missing_rank_times_out_naming_it(handle):
    with pytest.raises(ClusterError, match=r"ranks \[1\] have not pushed key 0 in round 0"):
        run(_rank1_never_pushes, num_workers=2, cluster=handle, timeout=2)


def _rank1_skips_barrier(kv):
    if kv.rank == 0:
        kv.barrier()


def test_barrier_timeout_names_absent_ranks(handle):
    with pytest.raises(ClusterError, match=r"generation 0 .*ranks \[1\] have not arrived"):
        run(_rank1_skips_barrier, num_workers=2, cluster=handle, timeout=2)


def _barriers(kv, n):
    return [kv.barrier() for _ in range(n)] and kv.barrier_generation


def test_barrier_is_reusable_100_times_back_to_back(handle):
    assert run(_barriers, num_workers=2, cluster=handle, args=(100,)) == [100, 100]


def _interleaved(kv, rounds):
    # Keys 0 and 1 live on servers 0 and 1, both on the SAME Dask worker. Rank 0
    # pushes both, then waits in server 0 for rank 1's push of key 0; rank 1
    # first needs server 1 to finish the round of key 1. A server that blocked
    # its worker's (single, shared) actor thread while waiting would keep
    # server 1 from ever serving those pushes: deadlock. Async waits must not.
    for _ in range(rounds):
        if kv.rank == 0:
            kv.push(0, np.ones(2))
            kv.push(1, np.ones(2))
            kv.pull(0)
            kv.pull(1)
        else:
            kv.push(1, np.ones(2))
            kv.pull(1)
            kv.push(0, np.ones(2))
            kv.pull(0)
    return kv.pull(0), kv.pull(1)


def test_two_shards_on_one_worker_with_interleaved_rounds_do_not_deadlock(handle):
    worker = handle.workers()[0]
    kv = labkv.create(
        "dist_sync", cluster=handle, num_servers=2, server_workers=[worker], timeout=20
    )
    try:
        kv.init([0, 1], [np.zeros(2), np.zeros(2)])
        assert {p["device"].split("@")[1] for k in (0, 1) for p in kv.placement()[k]} == {worker}
        assert {kv.placement()[k][0]["server"] for k in (0, 1)} == {0, 1}
        for a, b in run(_interleaved, num_workers=2, kvstore=kv, args=(20,)):
            np.testing.assert_array_equal(a, [2.0, 2.0])
            np.testing.assert_array_equal(b, [2.0, 2.0])
    finally:
        kv.close()


def test_bad_input_gets_the_local_errors_before_anything_is_sent(handle):
    local = labkv.create("local")
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2)
    try:
        for store in (local, kv):
            store.init(3, np.zeros((2, 3)))
        before = kv.server_load()
        bad_calls = [
            lambda s: s.push(3, np.ones((3, 2))),  # wrong shape
            lambda s: s.push(4, np.ones((2, 3))),  # not initialised
            lambda s: s.push("w", np.ones((2, 3))),  # str key on an int store
            lambda s: s.push([3, 3], [np.ones((2, 3))]),  # keys and values differ in length
            lambda s: s.pull(3, out=np.ones((2, 3))[::1].view().reshape(3, 2)),
            lambda s: s.init(3, np.zeros((2, 3))),  # already initialised
            lambda s: s.push(3, np.array([["a"] * 3] * 2)),  # non-numeric
        ]
        for call in bad_calls:
            with pytest.raises(Exception) as expected:
                call(local)
            with pytest.raises(type(expected.value)) as got:
                call(kv)
            assert str(got.value) == str(expected.value)
        assert kv.server_load() == before  # nothing reached a server
    finally:
        kv.close()


def _die_in_round(kv):
    kv.init(0, np.zeros(2))
    if kv.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    kv.push(0, np.ones(2))
    return kv.pull(0)


@pytest.mark.slow
def test_a_killed_worker_gives_a_clear_error_not_a_hang(handle):
    # The ranks' own timeout is long (60 s): the error must come from the
    # launcher noticing the dead worker, which names it.
    with pytest.raises(ClusterError, match=r"died: ranks \[1\] lost; servers \[1\] lost"):
        run(_die_in_round, num_workers=2, cluster=handle, timeout=60)


def test_servers_that_cannot_start_time_out_naming_their_worker(handle):
    # A server pinned to a worker that is gone waits for it forever in the scheduler:
    # the start must give up after its timeout, name the worker and leave nothing behind.
    gone = "tcp://127.0.0.1:9"
    started = time.monotonic()
    with pytest.raises(ClusterError, match=rf"servers \[0, 1\] of t-gone .* 1 s .*{gone}"):
        start_servers(handle, "dist_sync", 2, 1, timeout=1.0, workers=[gone], store_id="t-gone")
    assert time.monotonic() - started < 10
    assert wait_until(lambda: not server_tasks(handle.client, "t-gone"), 10)


def _kill_this_worker():
    os.kill(os.getpid(), signal.SIGKILL)


def _pid():
    return os.getpid()


@pytest.mark.slow
def test_a_call_waiting_on_a_server_the_scheduler_drops_fails_within_seconds(handle):
    # The server's worker is frozen, so the push neither fails nor answers; once
    # the scheduler removes that worker, the wait must say so, not run out its 25 s.
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2, timeout=20)
    kv.init([0, 1], [np.zeros(3, np.float32), np.zeros(5, np.float32)])
    victim = kv.placement()[1][0]["device"].split("@")[1]
    pid = handle.client.run(_pid, workers=[victim])[victim]

    async def drop(dask_scheduler):
        await dask_scheduler.remove_worker(victim, stimulus_id="test-drop")

    def drop_after_a_second():
        time.sleep(1.0)
        handle.client.run_on_scheduler(drop)

    os.kill(pid, signal.SIGSTOP)
    dropper = threading.Thread(target=drop_after_a_second)
    try:
        dropper.start()
        started = time.monotonic()
        with pytest.raises(ClusterError, match=rf"server 1 on Dask worker {victim} is lost"):
            kv.push([0, 1], [np.ones(3, np.float32), np.ones(5, np.float32)])
            kv.pull([0, 1])
        assert time.monotonic() - started < 20  # the loss, not the store's 20 s timeout
    finally:
        dropper.join()
        os.kill(pid, signal.SIGKILL)  # its nanny starts a fresh worker
        with contextlib.suppress(Exception):
            kv.close()
        handle.client.wait_for_workers(2, timeout=60)


@pytest.mark.slow
def test_a_store_resumes_from_its_checkpoint_after_losing_a_server(handle, tmp_path):
    # What docs/cluster.md gives as the recovery: values pulled and optimizer states
    # saved, then a new store on the cluster (its worker restarted by the nanny).
    keys = [0, 1]  # MXNet's rule: key 0 on server 0, key 1 on server 1
    grads = [np.full((2, 3), 1.0, np.float32), np.full(5, 2.0, np.float32)]
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2, timeout=20)
    kv.init(keys, [np.zeros((2, 3), np.float32), np.zeros(5, np.float32)])
    kv.set_optimizer("sgd", learning_rate=0.1, momentum=0.9)
    for _ in range(3):
        kv.push(keys, grads)
    checkpoint = kv.pull(keys)
    states = str(tmp_path / "optimizer.states")
    kv.save_optimizer_states(states)
    victim = kv.placement()[1][0]["device"].split("@")[1]
    with contextlib.suppress(Exception):  # the worker dies while answering
        handle.client.run(_kill_this_worker, workers=[victim])
    deadline = time.monotonic() + 30
    with pytest.raises(ClusterError, match=rf"server 1 on Dask worker {victim} is lost"):
        while time.monotonic() < deadline:  # the loss is noticed within seconds
            kv.push(keys, grads)
            kv.pull(keys)
            time.sleep(0.2)
    handle.client.wait_for_workers(2, timeout=60)
    resumed = labkv.create("dist_sync", cluster=handle, num_servers=2)
    reference = labkv.create("local")
    try:
        for store in (resumed, reference):
            store.init(keys, [c.copy() for c in checkpoint])
            store.set_optimizer("sgd", learning_rate=0.1, momentum=0.9)
            store.load_optimizer_states(states)
            store.push(keys, grads)
        for got, expected in zip(resumed.pull(keys), reference.pull(keys), strict=True):
            np.testing.assert_allclose(got, expected, rtol=1e-6)
        # the momentum came back: a fresh optimizer would step by -0.2 on key 1
        assert not np.allclose(reference.pull(1) - checkpoint[1], -0.2)
    finally:
        resumed.close()
        kv.close()
