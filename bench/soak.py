"""Memory of a watched store over a soak, and after it is closed.

    python bench/soak.py [--seconds=180]

A ``dask scheduler`` and 2 ``dask worker`` processes (CLI, 127.0.0.1), so that
the notebook (this process), the scheduler and each worker are measured apart.
A ``dist_sync`` store with 2 servers, watched by a monitor, takes push+pull
rounds of 4 small keys and one 1 MiB key for the whole soak; then the monitor
and the store are closed. Prints each process's resident memory (MiB) at the
start, every 30 s and 10 s after the close, and the scheduler's event topics
of the store. A benchmark, not a test: it prints, it asserts nothing.
"""

from __future__ import annotations

import gc
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import labkv  # noqa: E402
from labkv.cluster import connect  # noqa: E402
from labkv.cluster._events import topic_of
from labkv.widgets import monitor  # noqa: E402
from tests._cli import Procs, start_scheduler, start_worker  # noqa: E402


def _rss(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def _topics(dask_scheduler=None):
    return {t: len(topic.events) for t, topic in dask_scheduler._broker._topics.items()}


def main(seconds: float) -> None:
    tmp = Path(tempfile.mkdtemp())
    procs = Procs(tmp)
    try:
        address = start_scheduler(procs, tmp)
        start_worker(procs, "w", address, tmp, nworkers=2)
        with connect(address, n_workers=2) as handle:
            workers = handle.client.run(lambda: __import__("os").getpid())
            pids = {"notebook": psutil.Process().pid, "scheduler": procs.procs[0].pid}
            pids.update({f"worker {i}": pid for i, pid in enumerate(workers.values())})

            def row(label: str) -> None:
                cells = "  ".join(f"{_rss(p):9.1f}" for p in pids.values())
                print(f"{label:>14}  {cells}", flush=True)

            print(f"{'':>14}  " + "  ".join(f"{n:>9}" for n in pids))
            row("start")
            kv = labkv.create("dist_sync", cluster=handle, num_servers=2)
            mon = monitor(kv)
            names = ["a", "b", "c", "d", "big"]
            values = [np.ones(16, np.float32)] * 4 + [np.ones(1 << 18, np.float32)]
            kv.init(names, [np.zeros_like(v) for v in values])
            outs = [np.empty_like(v) for v in values]
            start = last = time.monotonic()
            rounds = 0
            while time.monotonic() - start < seconds:
                kv.push(names, values)
                kv.pull(names, out=outs)
                rounds += 1
                if time.monotonic() - last >= 30:
                    last = time.monotonic()
                    row(f"{last - start:5.0f} s")
            topic = topic_of(kv.store_id)
            held = handle.client.run_on_scheduler(_topics).get(topic)
            print(f"{rounds} rounds; the scheduler held {held} event batches of the store")
            mon.close()
            kv.close()
            del kv, mon
            gc.collect()
            time.sleep(10)
            row("closed + 10 s")
            left = handle.client.run_on_scheduler(_topics).get(topic)
            print(f"event batches of the store left on the scheduler: {left}")
    finally:
        procs.stop()


if __name__ == "__main__":
    seconds = 180.0
    for arg in sys.argv[1:]:
        if arg.startswith("--seconds="):
            seconds = float(arg.split("=", 1)[1])
    main(seconds)
