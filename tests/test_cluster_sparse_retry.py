"""The retry of a timed-out row-sparse push is recognised as the dense one is
(``DistStore._push_impl``: the next push, if it is the same, is not sent again): the
push's rows and their data are kept (:func:`labkv.cluster._rows.rank.kept_rows`) and
compared (:func:`labkv.cluster._rows.rank.same_rows`). In-process servers whose first
waited-for push is answered but reported as timed out, and the real ``LocalCluster``
with a frozen server, modelled on ``tests/test_cluster_timeouts.py``'s dense test."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

import labkv
import labkv.sparse as sparse
from labkv.cluster import ClusterError
from labkv.cluster._errors import CallTimedOut
from tests._inprocess import InProcessCluster

ROWS, WIDTH = 20_000, 64
TOUCHED = np.arange(0, ROWS, 4)  # 5,000 rows of 256 bytes: a push that is waited for


def _count(key, merged, stored):  # runs on the server: each push adds its rows once
    stored[merged.indices] += merged.data


def _grad(value: float = 1.0) -> sparse.RowSparseArray:
    data = np.full((len(TOUCHED), WIDTH), value, np.float32)
    return sparse.row_sparse_array((data, TOUCHED), shape=(ROWS, WIDTH))


def _pulled(kv) -> np.ndarray:
    out = sparse.zeros("row_sparse", (ROWS, WIDTH))
    kv.row_sparse_pull("e", out=out, row_ids=TOUCHED)
    assert out.indices.tolist() == TOUCHED.tolist()
    return out.data


def _first_wait_times_out(kv, monkeypatch) -> list[int]:
    """Make ``kv``'s first waited-for push report a timeout once it has been applied
    (what a late answer looks like to the rank); returns the count of waits."""
    calls, waits = kv._calls, []
    finish = calls.finish_pushes

    def late(sent, wait):
        finish(sent, wait)
        if wait:
            waits.append(1)
            if len(waits) == 1:
                raise CallTimedOut("push: no answer in time; it may still take effect")

    monkeypatch.setattr(calls, "finish_pushes", late)
    return waits


@pytest.mark.parametrize("kind", ["dist_async", "dist_sync"])
def test_the_retry_of_a_timed_out_row_sparse_push_is_not_applied_twice(kind, monkeypatch):
    with InProcessCluster(kind, 2, 1, timeout=5.0) as c:
        kv = c.ranks[0]
        kv.init("e", sparse.zeros("row_sparse", (ROWS, WIDTH)))
        kv.set_updater(_count)
        waits = _first_wait_times_out(kv, monkeypatch)
        grad = _grad()
        with pytest.raises(CallTimedOut, match="may still take effect"):
            kv.push("e", grad)
        ((_, (kept,)),) = kv._timed_out  # what is kept to compare: the rows, not the table
        assert isinstance(kept, sparse.RowSparseArray) and kept.data.base is None
        assert kept.data.nbytes == len(TOUCHED) * WIDTH * 4 and kept.indices is not grad.indices
        kv.push("e", grad)  # the user's retry: the same push, right after
        assert len(waits) == 1  # not sent again
        np.testing.assert_array_equal(_pulled(kv), 1.0)  # applied once
        kv.push("e", grad)  # after a pull, a push is a new one
        kv.push("e", _grad(2.0))
        np.testing.assert_array_equal(_pulled(kv), 4.0)


def test_a_changed_row_sparse_push_after_a_timeout_is_a_new_push(monkeypatch):
    with InProcessCluster("dist_async", 2, 1, timeout=5.0) as c:
        kv = c.ranks[0]
        kv.init("e", sparse.zeros("row_sparse", (ROWS, WIDTH)))
        kv.set_updater(_count)
        _first_wait_times_out(kv, monkeypatch)
        grad = _grad()
        with pytest.raises(CallTimedOut):
            kv.push("e", grad)
        grad.data[0, 0] = 5.0  # changed in place: not the push that timed out
        kv.push("e", grad)
        got = _pulled(kv)
        assert got[0, 0] == 6.0 and got[0, 1] == 2.0 and np.all(got[1:] == 2.0)
        # other rows (same data): a new push too
        _first_wait_times_out(kv, monkeypatch)
        moved = sparse.row_sparse_array((_grad().data, TOUCHED + 1), shape=(ROWS, WIDTH))
        with pytest.raises(CallTimedOut):
            kv.push("e", _grad())
        kv.push("e", moved)
        np.testing.assert_array_equal(_pulled(kv)[1:], 3.0)


# -- the real LocalCluster: a frozen server, as tests/test_cluster_timeouts.py -----------
def _pid():
    return os.getpid()


@pytest.mark.slow
def test_the_retry_of_a_row_sparse_push_to_a_frozen_server_is_not_applied_twice(handle):
    kv = labkv.create("dist_async", cluster=handle, num_servers=1, timeout=2)
    pid = None
    try:
        kv.init("e", sparse.zeros("row_sparse", (ROWS, WIDTH)))
        kv.set_updater(_count)
        address = kv.placement()["e"][0]["device"].split("@")[1]
        pid = handle.client.run(_pid, workers=[address])[address]
        os.kill(pid, signal.SIGSTOP)
        grad = _grad()
        with pytest.raises(ClusterError, match="may still take effect"):
            kv.push("e", grad)
        os.kill(pid, signal.SIGCONT)
        pid = None
        kv.push("e", grad)  # the user's retry
        np.testing.assert_array_equal(_pulled(kv), 1.0)
        kv.push("e", grad)
        kv.push("e", _grad(2.0))
        np.testing.assert_array_equal(_pulled(kv), 4.0)
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        kv.close()
