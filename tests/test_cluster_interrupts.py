"""Ctrl-C in a notebook: SIGINTs at random moments of pushes and pulls on a
distributed store leave it usable, each interrupted push applied whole or not
at all (checked against a count of the pushes made), never a store whose
every call waits out its timeout."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import numpy as np
import pytest

import labkv

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        threading.current_thread() is not threading.main_thread(), reason="needs the main thread"
    ),
    pytest.mark.usefixtures("python_s_own_sigint_handler"),
]

#: The stores' timeout: a run after an interrupt must not wait one out.
TIMEOUT_S = 30


def _count(key, merged, stored):
    stored += merged


def _join(killer: threading.Thread | None) -> None:
    """Wait for the interrupting thread (None: its start was interrupted, by its signal)."""
    if killer is not None:
        killer.join()


def _interrupt_after(delay: float) -> threading.Thread:
    def fire():
        time.sleep(delay)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=fire)
    thread.start()
    return thread


@pytest.mark.parametrize(
    "kind,replicas", [("dist_sync", 1), ("dist_async", 1), ("dist_sync", 2)], ids=str
)
def test_random_interrupts_of_pushes_and_pulls_leave_the_store_whole(handle, kind, replicas):
    kv = labkv.create(kind, cluster=handle, num_servers=1, replicas=replicas, timeout=10)
    rng = random.Random(11)
    try:
        kv.init("w", np.zeros(4, np.float32))
        kv.set_updater(_count)
        ones, out = np.ones(4, np.float32), np.empty(4, np.float32)
        done = in_doubt = interrupted = 0  # pushes returned, pushes interrupted since last check
        for _ in range(150):
            killer, stage = None, None
            try:
                killer = _interrupt_after(rng.uniform(0, 0.004))  # may fire inside start()
                for _ in range(3):
                    stage = "push"
                    kv.push("w", ones)
                    done += 1
                    stage = "pull"
                    kv.pull("w", out=out)
                stage = None
                _join(killer)  # the signal lands inside this block, whatever its timing
                time.sleep(0.01)
            except KeyboardInterrupt:
                interrupted += 1
                in_doubt += stage == "push"
            _join(killer)
            value = kv.pull("w")  # a gap in the push order would time out here
            assert np.all(value == value[0]), value
            assert done <= value[0] <= done + in_doubt, (value[0], done, in_doubt)
            done, in_doubt = int(value[0]), 0
        assert interrupted >= 100  # the signals landed, mostly inside calls
        kv.push("w", ones)
        assert kv.pull("w")[0] == done + 1
    finally:
        kv.close()


def test_an_interrupted_set_optimizer_reaches_every_server_or_none(handle):
    """A key sliced over 2 servers: its slices must stay equal, which they do
    not if an optimizer reached one server only."""
    kv = labkv.create("dist_async", cluster=handle, num_servers=2, bigarray_bound=4, timeout=10)
    rng = random.Random(5)
    try:
        kv.init("w", np.zeros(8, np.float32))
        interrupted = 0
        for trial in range(40):
            rate = 0.1 * (1 + trial % 2)
            killer = None
            try:
                killer = _interrupt_after(rng.uniform(0, 0.003))
                kv.set_optimizer(labkv.optimizers.SGD(learning_rate=rate))
                _join(killer)
                time.sleep(0.01)
            except KeyboardInterrupt:
                interrupted += 1
            _join(killer)
            kv.push("w", np.ones(8, np.float32))
            value = kv.pull("w")
            assert np.all(value == value[0]), value  # both slices updated alike
        assert interrupted >= 20
    finally:
        kv.close()


def _push_forever(kv):
    ones = np.ones(4, np.float32)
    while True:
        kv.push("w", ones)
        kv.pull("w")
        time.sleep(0.002)


def _push_once(kv):
    kv.push("w", np.ones(4, np.float32))
    kv.barrier()
    return kv.pull("w")


@pytest.mark.parametrize("kind", ["dist_async", "dist_sync"])
def test_ctrl_c_in_run_stops_its_ranks_and_the_next_run_works(handle, kind):
    from labkv.cluster import run

    kv = labkv.create(kind, cluster=handle, num_servers=1, timeout=TIMEOUT_S)
    try:
        kv.init("w", np.zeros(4, np.float32))
        kv.set_updater(_count)
        killer = None
        try:
            with pytest.raises(KeyboardInterrupt):
                killer = _interrupt_after(2.0)
                run(_push_forever, num_workers=2, kvstore=kv)
        finally:
            _join(killer)
        stopped = kv.peek("w")
        assert stopped[0] > 0  # the ranks did push before the interrupt
        time.sleep(1.0)
        np.testing.assert_array_equal(kv.peek("w"), stopped)  # and no more after it
        start = time.monotonic()
        for value in run(_push_once, num_workers=2, kvstore=kv):
            np.testing.assert_array_equal(value, stopped + 2)
        assert time.monotonic() - start < TIMEOUT_S  # not after a wait timed out
    finally:
        kv.close()


def test_the_rank_threads_of_a_stopped_run_are_seen_until_they_end(handle):
    from labkv.cluster._runtime.watch import _ranks_running

    slow = handle.client.submit(time.sleep, 1.5, key="labkv-rank-probe-0", pure=False)
    deadline = time.monotonic() + 10
    while slow.status == "pending" and time.monotonic() < deadline:
        running = handle.client.run(_ranks_running, ["labkv-rank-probe-0"])
        if any(running.values()):
            break
        time.sleep(0.05)
    assert any(running.values()), running
    slow.result()
    assert not any(handle.client.run(_ranks_running, ["labkv-rank-probe-0"]).values())
