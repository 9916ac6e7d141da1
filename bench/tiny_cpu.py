"""CPU per tiny dist_sync push+pull of labkv's own Python, without Dask.

    python bench/tiny_cpu.py [--iters=3000] [--runs=5] [--by-reference]

W = 2 ranks (two threads) on S = 1 in-process server (real ``Server`` objects
on an asyncio loop in a thread, real ``DistStore`` ranks, reached through the
in-process links of :mod:`labkv.cluster._runtime.inprocess`), each iteration
``kv.push(keys, grads); kv.pull(keys, out=outs)`` of one key of 1 float32, as
the "tiny" case of ``bench/dist.py``. Reports the CPU of the whole process (all
threads, ``time.process_time``) and the wall time per iteration, median of
``--runs`` runs: the CPU is what labkv's Python costs per call, and holds on a
busy machine where the wall time does not. The links pickle what they carry
as the stream does (``--by-reference``: hand it over, as a rank on the
server's worker does).
``--profile`` writes (and prints) the cProfile of one run, every thread merged
(its overhead inflates small functions: read it for call counts and shares).
A benchmark, not a test: it prints, it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import threading
import time
from pathlib import Path
from statistics import median

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests._inprocess import InProcessCluster  # noqa: E402


def _rank_loop(kv, iters: int, start: threading.Barrier, prof=None) -> None:
    keys = [0]
    grads = [np.ones(1, dtype=np.float32)]
    outs = [np.empty(1, dtype=np.float32)]
    for _ in range(5):  # warm up
        kv.push(keys, grads)
        kv.pull(keys, out=outs)
    start.wait()
    if prof is not None:
        prof.enable()
    for _ in range(iters):
        kv.push(keys, grads)
        kv.pull(keys, out=outs)
    if prof is not None:
        prof.disable()
    start.wait()


def run_once(iters: int, wire: bool, profile: str | None = None) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per iteration of one run; ``profile``: write
    there the cProfile of every thread (ranks and the servers' loop), merged."""
    with InProcessCluster("dist_sync", num_servers=1, num_workers=2, wire=wire) as c:
        for kv in c.ranks:
            kv.init([0], [np.zeros(1, dtype=np.float32)])
        start = threading.Barrier(3)
        profs = [cProfile.Profile() for _ in range(3)] if profile else [None] * 3
        threads = [
            threading.Thread(target=_rank_loop, args=(kv, iters, start, prof))
            for kv, prof in zip(c.ranks, profs, strict=False)
        ]
        for t in threads:
            t.start()
        loop = c.group.loop
        if profile:  # cProfile profiles the thread that enables it: the loop's own
            asyncio.run_coroutine_threadsafe(_call(profs[2].enable), loop).result()
        start.wait()
        cpu, wall = time.process_time(), time.perf_counter()
        start.wait()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        if profile:
            asyncio.run_coroutine_threadsafe(_call(profs[2].disable), loop).result()
        for t in threads:
            t.join()
    if profile:
        stats = pstats.Stats(profs[0])
        for prof in profs[1:]:
            stats.add(prof)
        stats.dump_stats(profile)
    return cpu / iters, wall / iters


async def _call(fn) -> None:
    fn()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--by-reference", action="store_true")
    parser.add_argument("--profile", help="write a cProfile of one run (every thread) there")
    args = parser.parse_args()
    wire = not args.by_reference
    run_once(200, wire)  # warm up (imports, first calls)
    if args.profile:
        run_once(args.iters, wire, args.profile)
        pstats.Stats(args.profile).sort_stats("tottime").print_stats(40)
        return
    runs = [run_once(args.iters, wire) for _ in range(args.runs)]
    cpus = sorted(r[0] for r in runs)
    walls = sorted(r[1] for r in runs)
    how = "pickled" if wire else "by reference"
    print(
        f"tiny push+pull, W=2 S=1 in-process ({how}), {args.iters} iterations x {args.runs} runs:\n"
        f"  CPU  per iteration: median {median(cpus) * 1e6:7.1f} us "
        f"(min {cpus[0] * 1e6:.1f}, max {cpus[-1] * 1e6:.1f})\n"
        f"  wall per iteration: median {median(walls) * 1e6:7.1f} us "
        f"(min {walls[0] * 1e6:.1f}, max {walls[-1] * 1e6:.1f})"
    )


if __name__ == "__main__":
    main()
