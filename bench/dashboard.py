"""What labkv's dashboard pages cost the scheduler, and what watching costs a run.

    python bench/dashboard.py [--ranks 8] [--keys 200] [--steps 20] [--rounds 2]

A CLI ``dask scheduler --preload labkv.dashboard`` (its own process, so its CPU
is its own) and ``--ranks`` single-threaded CLI workers; a dist_sync store on 2
servers holds ``--keys`` tiny keys; each step of ``run(fn, kvstore=kv)`` every
rank pushes and pulls every key. Per round, in a rotating order: the run
unwatched, and watched (``labkv.dashboard.watch``) with 0, 1 and 4 viewers
(Chromium tabs of ``/individual-labkv-rounds``, opened before the run). Printed
per condition: seconds per step (median over rounds) and its ratio to the
unwatched run, and the scheduler's CPU seconds per second of run; then the
scheduler's CPU per second while the store is idle, with 0 and 4 tabs open.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import labkv  # noqa: E402
import labkv.dashboard  # noqa: E402
from labkv.cluster import connect, run  # noqa: E402
from tests._cli import Procs, start_scheduler, start_worker  # noqa: E402
from tests.browser._lab import CHROME_ARGS, CHROMIUM  # noqa: E402


def steps(kv, n, keys):
    """Each step: a push and a pull of every key."""
    names = [f"k{i}" for i in range(keys)]
    grads = [np.ones(4, np.float32) for _ in names]
    outs = [np.zeros(4, np.float32) for _ in names]
    for _ in range(n):
        kv.push(names, grads)
        kv.pull(names, out=outs)
    return float(outs[0][0])


def cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--keys", type=int, default=200)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--idle", type=float, default=5.0)
    a = ap.parse_args()
    from playwright.sync_api import sync_playwright

    tmp = Path(tempfile.mkdtemp(prefix="labkv-dash-bench-"))
    procs = Procs(tmp)
    dashboard = ["--dashboard", "--dashboard-address", "127.0.0.1:0"]
    address = start_scheduler(procs, tmp, extra=[*dashboard, "--preload", "labkv.dashboard"])
    scheduler = psutil.Process(procs.procs[0].pid)
    start_worker(procs, "w", address, tmp, nworkers=a.ranks)
    try:
        with (
            connect(address, n_workers=a.ranks, set_as_default=False) as handle,
            sync_playwright() as pw,
        ):
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROME_ARGS, headless=True)
            kv = labkv.create("dist_sync", cluster=handle, num_servers=2)
            kv.init([f"k{i}" for i in range(a.keys)], [np.zeros(4, np.float32)] * a.keys)
            url = labkv.dashboard.urls(handle)[0]
            conditions = ["unwatched", "0 viewers", "1 viewer", "4 viewers"]
            per_step: dict[str, list[float]] = {c: [] for c in conditions}
            sched_cpu: dict[str, list[float]] = {c: [] for c in conditions}
            run(steps, a.ranks, kvstore=kv, args=(2, a.keys))  # warm-up
            for r in range(a.rounds):
                order = conditions[r % 4 :] + conditions[: r % 4]
                for cond in order:
                    watched = None if cond == "unwatched" else labkv.dashboard.watch(kv)
                    viewers = {"unwatched": 0, "0 viewers": 0, "1 viewer": 1, "4 viewers": 4}[cond]
                    tabs = [browser.new_page() for _ in range(viewers)]
                    for tab in tabs:
                        tab.goto(url, wait_until="domcontentloaded")
                        tab.get_by_text("store").first.wait_for(timeout=60_000)
                    c0, t0 = cpu(scheduler), time.perf_counter()
                    run(steps, a.ranks, kvstore=kv, args=(a.steps, a.keys))
                    wall = time.perf_counter() - t0
                    sched_cpu[cond].append((cpu(scheduler) - c0) / wall)
                    per_step[cond].append(wall / a.steps)
                    for tab in tabs:
                        tab.close()
                    if watched is not None:
                        watched.close()
                    print(
                        f"round {r} {cond:10s} {wall / a.steps * 1e3:7.1f} ms/step, "
                        f"scheduler {sched_cpu[cond][-1]:.3f} CPU s/s",
                        flush=True,
                    )
            base = statistics.median(per_step["unwatched"])
            print(f"\n{a.ranks} ranks x {a.keys} keys, {a.steps} steps, {a.rounds} rounds")
            print("condition   ms/step  ratio  scheduler CPU s/s (median [range])")
            for c in conditions:
                ms = statistics.median(per_step[c])
                s = sched_cpu[c]
                print(
                    f"{c:10s} {ms * 1e3:8.1f} {ms / base:6.2f}  "
                    f"{statistics.median(s):.3f} [{min(s):.3f} .. {max(s):.3f}]"
                )
            with labkv.dashboard.watch(kv):  # idle: a watched store, nothing running
                for viewers in (0, 4):
                    tabs = [browser.new_page() for _ in range(viewers)]
                    for tab in tabs:
                        tab.goto(url, wait_until="domcontentloaded")
                    time.sleep(2.0)
                    c0, t0 = cpu(scheduler), time.perf_counter()
                    time.sleep(a.idle)
                    used = (cpu(scheduler) - c0) / (time.perf_counter() - t0)
                    print(f"idle, {viewers} viewers: scheduler {used:.4f} CPU s/s")
                    for tab in tabs:
                        tab.close()
            kv.close()
            browser.close()
    finally:
        procs.stop()


if __name__ == "__main__":
    main()
