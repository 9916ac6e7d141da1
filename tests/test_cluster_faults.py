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
from labkv.cluster import ClusterError, connect, run
from labkv.cluster._runtime.compat import ClusterMismatchError
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
    return [kv.barrier() for _ in range(n)] and kv._barriers


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


def test_servers_pinned_to_a_worker_not_in_the_cluster_fail_at_once_naming_it(handle):
    # A server pinned to a worker the scheduler does not list (lost since the list
    # was made) would wait for it forever: the start must say so as soon as it looks,
    # not after its 60 s timeout, name the worker and each piece that was to start
    # there (replicas too), and leave nothing behind.
    gone = "tcp://127.0.0.1:9"
    live = handle.workers()[0]
    started = time.monotonic()
    with pytest.raises(ClusterError) as caught:
        start_servers(
            handle, "dist_sync", 2, 1, 60.0, workers=[live, gone], store_id="t-gone", replicas=2
        )
    assert time.monotonic() - started < 30  # half the timeout: it did not wait it out
    message = str(caught.value)
    assert f"Dask worker(s) ['{gone}'] are not in the cluster any more" in message
    assert "servers [1, 0 (replica 1)] were to start there" in message
    assert wait_until(lambda: not server_tasks(handle.client, "t-gone"), 10)


def test_servers_on_a_busy_worker_time_out_naming_it(handle):
    # A live worker whose only thread is busy: the servers' tasks wait behind it,
    # and the start gives up after its timeout, naming the worker.
    busy = handle.workers()[1]
    blocker = handle.client.submit(
        time.sleep, 4, workers=[busy], allow_other_workers=False, pure=False
    )
    try:
        assert wait_until(lambda: handle.client.processing(busy)[busy], 10)
        with pytest.raises(ClusterError) as caught:
            start_servers(handle, "dist_sync", 1, 1, 1.0, workers=[busy], store_id="t-busy")
        assert f"servers [0] of t-busy did not start within 1 s on Dask worker(s) ['{busy}']" in (
            str(caught.value)
        )
        assert wait_until(lambda: not server_tasks(handle.client, "t-busy"), 10)
    finally:
        handle.client.cancel([blocker])


def test_a_server_worker_not_in_the_cluster_is_named_as_lost_not_as_a_version_mismatch(handle):
    # A worker gone between the list and labkv's check of it (a kill at 0 s) cannot
    # answer the check: that is a lost worker, not one running another labkv.
    gone = "tcp://127.0.0.1:9"
    with pytest.raises(ClusterError) as caught:
        labkv.create("dist_sync", cluster=handle, server_workers=[handle.workers()[0], gone])
    assert not isinstance(caught.value, ClusterMismatchError)
    assert f"Dask worker(s) ['{gone}'] are not in the cluster" in str(caught.value)


@pytest.fixture
def three():
    """A 3-worker cluster of this test's own, whose workers it kills."""
    own = connect(n_workers=3, dashboard_address=None, memory_limit="1GiB", set_as_default=False)
    yield own
    own.close()


@pytest.mark.slow
def test_a_worker_killed_while_its_servers_start_fails_the_start_naming_it(three):
    # The victim's only thread is busy, so the servers pinned there wait on it
    # when it is killed: a task pinned to a lost worker never runs, and the start
    # must say so within seconds (its timeout is 120 s), naming the worker, with
    # replicas=2 too, and release the servers that did start.
    client = three.client
    victim = three.workers()[1]
    pid = client.run(os.getpid, workers=[victim])[victim]
    blocker = client.submit(
        time.sleep, 300, workers=[victim], allow_other_workers=False, pure=False
    )
    assert wait_until(lambda: client.processing(victim)[victim], 30)
    outcome = {}

    def create():
        try:
            labkv.create("dist_sync", cluster=three, num_servers=2, replicas=2, timeout=120)
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=create, daemon=True)
    thread.start()

    def queued_behind_the_blocker():
        keys = client.processing(victim).get(victim, [])
        return any(str(k).startswith("labkv-server-") for k in keys)

    assert wait_until(queued_behind_the_blocker, 60)
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    thread.join(timeout=130)
    seconds = time.monotonic() - killed
    error = outcome.get("error")
    assert isinstance(error, ClusterError) and not isinstance(error, ClusterMismatchError), error
    assert f"Dask worker(s) ['{victim}'] are not in the cluster any more" in str(error)
    assert seconds < 60, f"the start waited {seconds:.0f} s after its worker was killed"
    assert wait_until(lambda: not server_tasks(client), 10)
    client.cancel([blocker])


@pytest.mark.slow
def test_a_worker_killed_before_labkv_checks_it_is_named_as_lost(three):
    # The worker list was made, then the worker was killed and dropped before
    # labkv's check reached it (the kill at 0 s): a lost worker, not a mismatch.
    client = three.client
    workers = three.workers()
    victim = workers[2]
    pid = client.run(os.getpid, workers=[victim])[victim]
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: victim not in three.workers(), 30)
    with pytest.raises(ClusterError) as caught:
        labkv.create("dist_sync", cluster=three, num_servers=2, replicas=2, server_workers=workers)
    assert not isinstance(caught.value, ClusterMismatchError)
    assert f"Dask worker(s) ['{victim}'] are not in the cluster" in str(caught.value)


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
