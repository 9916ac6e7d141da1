"""A frozen server (its worker stopped by SIGSTOP): a timed-out call says it
may still take effect, the store's next call waits for its answer (so the push
is applied once, in order), and ``run`` reports the frozen server within its
documented bound, ``timeout + GRACE_S``."""

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
from labkv.cluster._transport.base import GRACE_S
from tests._ranks import push_and_pull_for

pytestmark = pytest.mark.slow

BIG = 1 << 19  # float32 elements: 2 MiB, a push that is waited for


def _pid():
    return os.getpid()


def _count(key, merged, stored):
    stored += merged


def _frozen(handle, address):
    pid = handle.client.run(_pid, workers=[address])[address]
    os.kill(pid, signal.SIGSTOP)
    return pid


@contextlib.contextmanager
def _store_with_a_frozen_server(handle):
    """A dist_async store (timeout 2 s, the value counting the pushes applied) whose
    one server's worker is stopped; ``thaw()`` resumes it (done at the end anyway)."""
    kv = labkv.create("dist_async", cluster=handle, num_servers=1, timeout=2)
    frozen = {}

    def thaw():
        os.kill(frozen.pop("pid"), signal.SIGCONT)

    try:
        kv.init("w", np.zeros(BIG, np.float32))
        kv.set_updater(_count)
        frozen["pid"] = _frozen(handle, kv.placement()["w"][0]["device"].split("@")[1])
        yield kv, thaw
    finally:
        if "pid" in frozen:
            thaw()
        kv.close()


def test_a_timed_out_push_is_applied_once_and_before_the_next_call(handle):
    with _store_with_a_frozen_server(handle) as (kv, thaw):
        started = time.monotonic()
        with pytest.raises(ClusterError, match="may still take effect"):
            kv.push("w", np.ones(BIG, np.float32))
        assert time.monotonic() - started < 2 + GRACE_S + 3
        thaw()
        value = kv.pull("w")  # waits for the push's answer first
        assert np.all(value == 1.0)
        kv.push("w", np.ones(BIG, np.float32))
        assert np.all(kv.pull("w") == 2.0)


def test_the_retry_of_a_timed_out_push_is_not_applied_twice(handle):
    with _store_with_a_frozen_server(handle) as (kv, thaw):
        grad = np.ones(BIG, np.float32)
        with pytest.raises(ClusterError, match="may still take effect"):
            kv.push("w", grad)
        thaw()
        kv.push("w", grad)  # the user's retry: the same push, right after
        assert np.all(kv.pull("w") == 1.0)  # applied once
        kv.push("w", grad)  # after a pull, a push is a new one
        kv.push("w", grad * 2)
        assert np.all(kv.pull("w") == 4.0)


def test_run_reports_a_frozen_server_within_its_bound(handle):
    workers = handle.workers()
    timeout = 4.0
    state = {}

    def freeze():
        time.sleep(1.5)
        state["pid"] = _frozen(handle, workers[0])  # server 0 and rank 0 live there
        state["at"] = time.monotonic()

    freezer = threading.Thread(target=freeze)
    freezer.start()
    try:
        with pytest.raises(ClusterError, match="did not answer"):
            run(
                push_and_pull_for,
                num_workers=2,
                num_servers=1,
                cluster=handle,
                timeout=timeout,
                args=(30,),
            )
        assert time.monotonic() - state["at"] < timeout + GRACE_S + 2.5
    finally:
        freezer.join()
        if "pid" in state:
            os.kill(state["pid"], signal.SIGCONT)
        handle.client.wait_for_workers(2, timeout=60)
