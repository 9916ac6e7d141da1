"""Per-call cost of dist_ssp when no pull waits, against dist_async, measured in one run.

    python bench/ssp.py [--quick]

W = 2 ranks (``labkv.cluster.run``) on an embedded 2-worker LocalCluster, S = 2
servers: push+pull of one tiny key, and of 200 keys x 1 KiB, per iteration.
dist_ssp runs with a bound no rank reaches (no pull waits: what it costs over
dist_async is the clocks' bookkeeping) and with s = 0 (pulls wait for the other
rank: shown for scale). The stores alternate, best of 3 each. A benchmark, not a
test: it prints a table and the ratio, and asserts nothing.
"""

from __future__ import annotations

import sys
import time

import numpy as np

STORES = [("dist_async", None), ("dist_ssp", 10**9), ("dist_ssp", 0)]


def _loop(kv, keys, size, iters):
    values = [np.ones(size, np.float32) for _ in keys]
    kv.init(keys, values)
    kv.barrier()
    outs = [np.empty(size, np.float32) for _ in keys]
    for _ in range(max(10, iters // 10)):  # warm up
        kv.push(keys, values)
        kv.pull(keys, out=outs)
    kv.barrier()
    t = time.perf_counter()
    for _ in range(iters):
        kv.push(keys, values)
        kv.pull(keys, out=outs)
    return (time.perf_counter() - t) / iters


def main(quick: bool = False) -> None:
    from labkv.cluster import connect, run

    cases = [
        ("tiny", ["w"], 4, 300 if quick else 2000),
        ("1 KiB x200", None, 256, 30 if quick else 200),
    ]
    with connect(n_workers=2, dashboard_address=None) as handle:
        print(f"{'case':<12} {'store':<18} {'us per push+pull':>18}")
        for name, keys, size, iters in cases:
            keys = keys or [f"k{i}" for i in range(200)]
            best: dict[tuple, float] = {}
            for _ in range(3):
                for kind, s in STORES:
                    kwargs = {} if s is None else {"staleness": s}
                    per_rank = run(
                        _loop, 2, kind, 2, handle, args=(keys, size, iters), timeout=60, **kwargs
                    )
                    t = max(per_rank)
                    best[(kind, s)] = min(best.get((kind, s), t), t)
            for (kind, s), t in best.items():
                label = kind if s is None else f"{kind} s={'inf' if s > 10**6 else s}"
                print(f"{name:<12} {label:<18} {t * 1e6:>18.1f}")
            ratio = best[("dist_ssp", 10**9)] / best[("dist_async", None)]
            print(f"{name:<12} dist_ssp (no wait) / dist_async: {ratio:.3f}x")


if __name__ == "__main__":
    main("--quick" in sys.argv)
