"""bench/_watched_cluster.py, the in-process run that bench/monitor_overhead.py and
the 64-rank browser test watch: a monitor attached to it counts every rank's
pushes and pulls of every key (the bench stays in step with the event bus)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

from labkv.widgets import monitor


def _watched_cluster_class():
    """``bench/_watched_cluster.py``'s class, loaded by its path: putting ``bench/`` on
    sys.path would let its ``sparse.py`` stand in for the ``sparse`` package that
    dask.array looks for."""
    path = Path(__file__).resolve().parents[1] / "bench" / "_watched_cluster.py"
    spec = importlib.util.spec_from_file_location("_watched_cluster", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.WatchedCluster


@pytest.mark.parametrize("workers, servers, keys", [(4, 2, 10), (3, 1, 5)])
def test_a_monitor_counts_every_rank_s_calls_of_a_watched_run(workers, servers, keys):
    cluster = _watched_cluster_class()(workers, servers, keys, timeout=30.0)
    try:
        mon = monitor(cluster.kv)
        rounds = 2
        cluster.rounds(rounds)
        want = {(workers * rounds, workers * rounds)}
        deadline = time.monotonic() + 30.0
        counts: set[tuple[int, int]] = set()
        while time.monotonic() < deadline:
            mon.refresh()
            counts = {(s.pushes, s.pulls) for s in mon.model.keys.values()}
            if counts == want and len(mon.model.keys) == keys:
                break
            time.sleep(0.1)
        assert len(mon.model.keys) == keys
        assert counts == want
        mon.close()
    finally:
        cluster.close()
