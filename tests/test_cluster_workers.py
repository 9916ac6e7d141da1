"""Which workers are alive is asked of the scheduler, never read from a cache
that the client's periodic refresh can overwrite."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("distributed")

import dask
from distributed import Client

from labkv.cluster import ClusterHandle, run


@pytest.fixture
def eager_refresh(handle):
    """A second client on the session cluster whose scheduler-info cache is
    refreshed every millisecond (Dask's default is every 2 s): a decision that
    reads that cache meets a refresh that lists no workers within a few calls."""
    with dask.config.set({"distributed.client.scheduler-info-interval": "1ms"}):
        client = Client(handle.address, set_as_default=False, direct_to_workers=True)
    attached = ClusterHandle(client)
    yield attached
    attached.close()


def test_the_live_workers_are_never_reported_missing(handle, eager_refresh):
    expected = handle.workers()
    assert len(expected) == 2
    seen = [eager_refresh.workers() for _ in range(300)]
    assert [w for w in seen if w != expected] == []


def _push_rank(kv):
    kv.init(0, np.zeros(2))
    kv.push(0, np.full(2, kv.rank + 1.0))
    return kv.pull(0)


def test_many_healthy_runs_never_report_a_worker_dead(eager_refresh):
    for _ in range(12):
        results = run(_push_rank, num_workers=2, cluster=eager_refresh, timeout=30)
        for value in results:
            np.testing.assert_array_equal(value, [3.0, 3.0])
