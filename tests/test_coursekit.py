"""The course's plumbing (notebooks/coursekit.py) where a notebook's lesson rests on it."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

import labkv

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "notebooks"))
from coursekit import wait_for_reseed  # noqa: E402 (the notebooks' folder on the path first)

pytestmark = pytest.mark.slow  # a worker of the session's cluster is killed


def _pid():
    return os.getpid()


def test_waiting_for_a_reseed_leaves_no_call_in_the_stores_events(handle):
    """Notebook 08 reads the monitor's event log after a failover: the wait for the
    re-seed asks the store to look for a worker (no free one at the failover here:
    both workers hold a replica until the killed one comes back) without a pull."""
    kv = labkv.create("dist_sync", cluster=handle, num_servers=1, replicas=2, timeout=20)
    events = []
    kv.events.subscribe(events.append, detail_interval=0.0)
    try:
        kv.init("w", np.zeros(4, np.float32))
        kv.pull("w")
        kv.events.flush()
        assert any(e.op == "pull" for e in events)  # a pull is an event this test sees
        primary = kv.placement()["w"][0]["replicas"][0]
        os.kill(handle.client.run(_pid, workers=[primary])[primary], signal.SIGKILL)
        kv.push("w", np.ones(4, np.float32))
        kv.pull("w")  # fails over to the backup: no worker free to seed a new one on
        kv.events.flush()
        seen = len(events)
        assert not any(e.op == "reseed" and "added" in e.extra for e in events)
        wait_for_reseed(kv, handle, events, workers=2)
        kv.events.flush()
        ops = [e.op for e in events[seen:]]  # the push's receipts may come late: no pull
        assert "reseed" in ops and "pull" not in ops, ops
    finally:
        kv.close()
