"""The notebook the browser test drives: a store, ``monitor(kv)``, then later cells
that push (kernel thread) and deliver cluster events (a background thread) under
the fan-in grid shown on its own (``mon.show("fan-in")``)."""

from __future__ import annotations

from pathlib import Path

HOSTILE = "<img src=x onerror=alert(1)>"
N_PUSH = 60

SETUP = f"""
import threading, time
import numpy as np
import labkv
from labkv.events import Event
from labkv.widgets import monitor

HOSTILE = {HOSTILE!r}
kv = labkv.create("local")
kv.init("w", np.zeros((4, 8)))
kv.init(HOSTILE, np.zeros(3))

def update(key, merged, stored):
    stored += merged * 2

kv.set_updater(update)
mon = monitor(kv)
mon
"""

PUSH = f"""
for i in range({N_PUSH}):  # a busy cell: the monitor must update while it runs
    kv.push("w", np.ones((4, 8)))
    kv.pull("w")
    time.sleep(0.05)
kv.push(HOSTILE, np.ones(3))
"""

CLUSTER = """
def cluster_events():  # as the Dask client's thread would deliver them
    t = time.time()
    kv.events.deliver(Event(0, t, "dist_sync", "round", "w", server=0, extra={
        "round": 7, "pushed": [0, 1], "missing": [2], "num_workers": 3,
        "waited_s": 1.5, "complete": False}))
    kv.events.deliver(Event(0, t, "dist_ssp", "clock", "w", rank=0, server=0, extra={
        "clocks": [9, 4, 8], "clock": 9, "staleness": 5, "slowest": [1], "slowest_clock": 4,
        "waited_s": 0.75}))
    for s in (0, 1):
        kv.events.deliver(Event(0, t, "dist_sync", "load", None, server=s, extra={
            "bytes_in": 4096 * (s + 1), "bytes_out": 2048, "keys": 1, "bytes_held": 128,
            "device": f"gpu({s})"}))

mon.show("fan-in")  # the grid alone, here, while the dashboard above shows its keys tab
thread = threading.Thread(target=cluster_events)
thread.start()
thread.join()
print("CELLS DONE")
"""


def _write(path: Path, sources: tuple[str, ...]) -> None:
    """A notebook of one code cell per source, on the python3 kernel."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [new_code_cell(src.strip()) for src in sources]
    nbformat.write(nb, str(path))


def build(path: Path) -> None:
    _write(path, (SETUP, PUSH, CLUSTER))


LATE = """
import time
import numpy as np
import labkv
from labkv.widgets import monitor

kv = labkv.create("local")
kv.init("w", np.zeros(4))
mon = monitor(kv)
for i in range(4):
    kv.push("w", np.ones(4))
    kv.pull("w")
time.sleep(1.5)  # the events are older than a second when the monitor is shown
mon
"""

# The timeline drawn before the page has any view of it: its tab chosen, and the
# monitor refreshed, before the monitor is displayed.
DRAWN_BEFORE_SHOWN = """
early = monitor(kv)
kv.push("w", np.ones(4))
kv.pull("w")
_ = early.widget
early.select("w")
early.dashboard.tabs.selected_index = 3  # the timeline tab
early.refresh()
time.sleep(1.5)
early
"""


def build_late(path: Path) -> None:
    """A notebook that shows a monitor after its store's events, then one whose
    timeline was drawn before it was shown."""
    _write(path, (LATE, DRAWN_BEFORE_SHOWN))


# 64 ranks x 500 keys: every key's round, rank 17 missing on every 12th key (waiting),
# the others complete; a push counted per key; then the fan-in grid shown alone.
SCALE = """
import time
import labkv
from labkv.events import Event
from labkv.widgets import monitor

kv = labkv.create("local")
mon = monitor(kv)
mon
"""

SCALE_EVENTS = """
t = time.time()
events = []
for key in range(500):
    pushed = [r for r in range(64) if r != 17 or key % 12]
    events.append(Event(0, t, "dist_sync", "push", key, server=0, nbytes=64 * 16, count=64))
    events.append(Event(0, t, "dist_sync", "round", key, server=0, extra={
        "round": 99, "pushed": pushed, "missing": [] if key % 12 else [17],
        "num_workers": 64, "waited_s": 0.5, "complete": bool(key % 12)}))
kv.events.deliver_many(events)
mon.refresh()
mon.show("fan-in")
print("CELLS DONE")
"""


def build_scale(path: Path) -> None:
    """A notebook whose monitor holds a 64-rank, 500-key store's rounds, one rank late."""
    _write(path, (SCALE, SCALE_EVENTS))


# A real in-process run, 64 ranks x 500 keys (bench/_watched_cluster.py: real servers
# and DistStore ranks, every message pickled as Dask would, the servers' and ranks'
# event batches delivered to the notebook's bus): two watched rounds, then a round
# that rank 17 holds up on 40 keys (every other rank pushed them).
REAL_SCALE = """
import sys, threading, time
import numpy as np
sys.path.insert(0, {bench!r})
from _watched_cluster import WatchedCluster
from labkv.widgets import monitor

cluster = WatchedCluster(64, 4, 500)
mon = monitor(cluster.kv)
mon
"""

REAL_SCALE_ROUNDS = """
per_round = cluster.rounds(2)
held = list(range(0, 480, 12))  # 40 keys
def push(kv):
    kv.push(held, [np.ones(4, np.float32) for _ in held])
threads = [threading.Thread(target=push, args=(kv,)) for kv in cluster.ranks if kv.rank != 17]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
time.sleep(1.0)  # the servers' next flush reports the open rounds
mon.refresh()
counts = {(s.pushes, s.pulls) for s in mon.model.keys.values()}
print(f"REAL ROUNDS {per_round * 1e3:.0f} ms per round; counts {sorted(counts)}")
print("CELLS DONE")
"""


def build_real_scale(path: Path) -> None:
    """A notebook whose monitor watches a real in-process run of 64 ranks x 500 keys,
    rank 17 holding up 40 keys' rounds."""
    bench = str(Path(__file__).resolve().parents[2] / "bench")
    _write(path, (REAL_SCALE.format(bench=bench), REAL_SCALE_ROUNDS))
