"""bench/_watched_cluster.py, the in-process run that bench/monitor_overhead.py and
the 64-rank browser test watch: a monitor attached to it counts every rank's
pushes and pulls of every key (the bench stays in step with the event bus)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from _watched_cluster import WatchedCluster  # noqa: E402

from labkv.widgets import monitor  # noqa: E402


@pytest.mark.parametrize("workers, servers, keys", [(4, 2, 10), (3, 1, 5)])
def test_a_monitor_counts_every_rank_s_calls_of_a_watched_run(workers, servers, keys):
    cluster = WatchedCluster(workers, servers, keys, timeout=30.0)
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
