"""``Monitor.settle``: after a run, the monitor's numbers are the servers' own, so the
last picture a closed monitor keeps is complete (notebook 04's server tables)."""

from __future__ import annotations

import numpy as np

import labkv
from labkv.cluster import run
from labkv.widgets import monitor

ELEMENTS = 200_000


def _push_and_pull(kv, iterations):
    grad = np.ones(ELEMENTS, np.float32)
    for _ in range(iterations):
        kv.push("model", grad)
        kv.pull("model")


def test_settle_waits_for_every_servers_last_report(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2, bigarray_bound=10_000)
    mon = monitor(kv)
    try:
        kv.init("model", np.zeros(ELEMENTS, np.float32))
        run(_push_and_pull, num_workers=2, kvstore=kv, args=(3,))
        assert mon.settle(timeout=20)
        loads = kv.server_load()
        shown = {s: (ld.bytes_in, ld.bytes_out) for s, ld in mon.model.servers.items()}
        assert shown == {ld["server"]: (ld["bytes_in"], ld["bytes_out"]) for ld in loads}
        # each server holds half the model: the same bytes on both
        assert shown[0] == shown[1] and shown[0][1] == 2 * 3 * ELEMENTS * 4 // 2
        stats = mon.model.keys["model"]
        assert (stats.pushes, stats.pulls) == (6, 6)
        mon.close()  # the last picture keeps those numbers
        assert {s: (ld.bytes_in, ld.bytes_out) for s, ld in mon.model.servers.items()} == shown
        assert mon.settle(timeout=0)  # closed: nothing to wait for
    finally:
        mon.close()
        kv.close()


def test_settle_gives_up_after_its_timeout(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=1)
    mon = monitor(kv)
    try:
        kv.init("w", np.zeros(4, np.float32))
        assert not mon.settle(timeout=0, quiet=1.0)  # no quiet second within no time
    finally:
        mon.close()
        kv.close()
