"""A lost scheduler is named as the cause within seconds, by a notebook store
and by ``run`` (Dask's workers stop with their scheduler, and every server's
values with them): not a lost server, not Dask's ``FuturesCancelledError``
half a minute later."""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest

import labkv
from labkv.cluster import ClusterError, connect, run
from tests._cli import Procs, start_scheduler, start_worker
from tests._ranks import push_and_pull_for

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("under", ["store", "run"])
def test_a_killed_scheduler_is_named_within_seconds(tmp_path, under):
    procs = Procs(tmp_path)
    handle = None
    try:
        address = start_scheduler(procs, tmp_path)
        start_worker(procs, "w", address, tmp_path, nworkers=2)
        handle = connect(address, n_workers=2, set_as_default=False)
        scheduler = procs.procs[0]
        if under == "store":
            kv = labkv.create("dist_sync", cluster=handle, num_servers=2, timeout=60)
            kv.init("w", np.zeros(4, np.float32))
            kv.push("w", np.ones(4, np.float32))
            np.testing.assert_array_equal(kv.pull("w"), np.ones(4))
            scheduler.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            with pytest.raises(ClusterError, match="scheduler at .* is gone"):
                for _ in range(1000):
                    kv.push("w", np.ones(4, np.float32))
                    kv.pull("w")
                    time.sleep(0.01)
        else:
            threading.Timer(3.0, scheduler.send_signal, (signal.SIGKILL,)).start()
            with pytest.raises(ClusterError, match="scheduler at .* is gone"):
                run(push_and_pull_for, num_workers=2, cluster=handle, timeout=60, args=(60, 0.005))
            killed = time.monotonic() - 3.0
        assert time.monotonic() - killed < 60  # the loss, not the 60 s timeout
        with pytest.raises(ClusterError, match="scheduler"):
            handle.workers()  # at once, not after the connect timeout
    finally:
        if handle is not None:
            handle.client.close(timeout=5)
        procs.stop()


def test_a_scheduler_lost_while_a_runs_servers_start_is_named(tmp_path, monkeypatch):
    """The scheduler dies after run's checks, as its servers are submitted: the
    error names the scheduler, not Dask's cancelled server futures."""
    import labkv.cluster._runtime.run as run_module

    procs = Procs(tmp_path)
    handle = None
    try:
        address = start_scheduler(procs, tmp_path)
        start_worker(procs, "w", address, tmp_path, nworkers=2)
        handle = connect(address, n_workers=2, set_as_default=False)
        scheduler, start_servers = procs.procs[0], run_module.start_servers

        def scheduler_dies_first(*args, **kwargs):
            scheduler.send_signal(signal.SIGKILL)
            scheduler.wait(timeout=10)
            return start_servers(*args, **kwargs)

        monkeypatch.setattr(run_module, "start_servers", scheduler_dies_first)
        with pytest.raises(ClusterError, match="scheduler at .* is gone"):
            run(push_and_pull_for, num_workers=2, cluster=handle, timeout=60, args=(60, 0.005))
    finally:
        if handle is not None:
            handle.client.close(timeout=5)
        procs.stop()
