"""Workers killed one after another during ``run(..., replicas=2,
on_rank_loss="replace")``: how many come back, and how fast.

    python bench/kills.py [--kills=N] [--every=S] [--target=servers|ranks|any]
                          [--workers=4] [--wait=S] [--hogs=N] [--no-store]

An embedded LocalCluster of ``--workers`` nanny-managed workers runs a 2-rank
dist_sync run (2 servers, 2 replicas, SGD with momentum, ``kv.steps``) long
enough to outlast the kills. From this process, every ``--every`` seconds, one
worker process is SIGKILLed: a worker that runs no rank (``servers``, the
default), one that runs a rank (``ranks``) or either (``any``). After the last
kill the script counts the live workers every second for ``--wait`` seconds
(default 90) and prints, per kill, how long until the nanny's restarted worker
had registered with the scheduler, and the count at the end; then whether the
run ended and its values equal an undisturbed run's. ``--no-store`` kills the
same way with no labkv store or run (Dask alone, the control); ``--hogs=N``
runs N busy loops beside the cluster (a loaded machine).

A benchmark, not a test: it prints, it asserts nothing (exit status 1 when a
worker is missing at the end, so a shell loop can count batches).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
import threading
import time

import numpy as np
from _hogs import Hogs

KEYS = ["w", "b", "big"]
SIZES = {"w": 6, "b": 3, "big": 1500}


def _zeros():
    return [np.zeros(SIZES[k], np.float32) for k in KEYS]


def train(kv, steps, pause):
    import labkv

    kv.init(KEYS, _zeros())
    kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.05, momentum=0.9, wd=0.01))
    kv.barrier()
    for step in kv.steps(steps):
        outs = _zeros()
        kv.pull(KEYS, out=outs)
        for i, key in enumerate(KEYS):
            noise = step.rng.standard_normal(SIZES[key]).astype(np.float32)
            kv.push(key, 0.1 * outs[i] + noise * (kv.rank + 1 + i))
        time.sleep(pause)
    outs = _zeros()
    kv.pull(KEYS, out=outs)
    return [o.tobytes() for o in outs]


def _arg(name, default):
    for a in sys.argv[1:]:
        if a.startswith(f"--{name}="):
            return type(default)(a.split("=", 1)[1])
    return default


def _rank_workers(client):
    """Workers that run a rank task now."""
    processing = client.processing()
    return {w for w, keys in processing.items() if any("labkv-rank-" in str(k) for k in keys)}


def main():
    from labkv.cluster import connect, run

    kills = _arg("kills", 6)
    every = _arg("every", 5.0)
    target = _arg("target", "servers")
    n = _arg("workers", 4)
    wait = _arg("wait", 90.0)
    steps = _arg("steps", 200)
    pause = _arg("pause", 0.05)
    no_store = "--no-store" in sys.argv
    verbose = "--verbose" in sys.argv
    hogs = Hogs(_arg("hogs", 0)).start()  # busy loops beside the cluster
    rng = random.Random(_arg("seed", 0))

    handle = connect(
        n_workers=n,
        dashboard_address=None,
        memory_limit="1GiB",
        set_as_default=False,
        silence_logs=logging.INFO if verbose else logging.ERROR,
    )
    client = handle.client
    nannies = handle.cluster.workers  # name -> Nanny, in this process
    outcome = {}

    def go(**kw):
        return run(
            train,
            num_workers=2,
            cluster=handle,
            num_servers=2,
            bigarray_bound=1000,
            timeout=30,
            args=(steps, pause),
            **kw,
        )

    try:
        if not no_store:
            t = time.monotonic()
            want = go(replicas=2)
            print(f"undisturbed run: {time.monotonic() - t:.1f} s")

            def disturbed():
                try:
                    outcome["result"] = go(replicas=2, on_rank_loss="replace")
                except BaseException as exc:
                    outcome["error"] = exc

            runner = threading.Thread(target=disturbed, daemon=True)
            runner.start()
            time.sleep(3.0)
        killed = []
        for k in range(kills):
            live = handle.workers()
            ranked = _rank_workers(client) if not no_store else set()
            pool = {
                "servers": [w for w in live if w not in ranked],
                "ranks": [w for w in live if w in ranked],
                "any": live,
            }[target] or live
            victim = rng.choice(pool)
            pid = next(
                (
                    nanny.process.pid
                    for nanny in nannies.values()
                    if nanny.process is not None and nanny.worker_address == victim
                ),
                None,
            )
            if pid is None:
                print(f"kill {k}: no process for {victim}")
                continue
            os.kill(pid, signal.SIGKILL)
            killed.append((time.monotonic(), victim, set(live)))
            print(f"kill {k} at {time.strftime('%X')}: {victim} (pid {pid}); {len(live)} live")
            time.sleep(every)
        start = time.monotonic()
        counts = []
        while time.monotonic() - start < wait:
            counts.append(len(handle.workers()))
            if counts[-1] == n and time.monotonic() - start > 5:
                break
            time.sleep(1.0)
        back = len(handle.workers())
        print(f"workers back {time.monotonic() - start:.0f} s after the last kill: {back}/{n}")
        print(f"live counts, 1 s apart: {counts}")
        if not no_store:
            runner.join(timeout=120)
            if "error" in outcome:
                print(f"run failed: {type(outcome['error']).__name__}: {outcome['error']}")
            elif "result" in outcome:
                same = outcome["result"] == want
                print(f"run ended, values {'bit-identical' if same else 'DIFFERENT'}")
            else:
                print("run still running after 120 s")
        statuses = {name: str(nanny.status) for name, nanny in nannies.items()}
        procs = {
            name: (nanny.process.status if nanny.process is not None else None)
            for name, nanny in nannies.items()
        }
        print(f"nanny status: {statuses}")
        print(f"worker process status: {procs}")
        return 0 if back == n else 1
    finally:
        handle.close()
        hogs.stop()


if __name__ == "__main__":
    sys.exit(main())
