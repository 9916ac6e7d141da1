"""What the step loop costs: dist_sync push+pull inside ``kv.steps(n)`` against
the same calls in a plain ``range(n)`` loop, in alternating blocks inside the
same ranks.

    python bench/steps.py [--quick]

W = 2 ranks on an embedded LocalCluster of 2 workers, one store. Inside
``kv.steps`` every push and pull carries the step, and every server keeps each
key's value one round back (a copy per key per round: what a replaced rank's
replay reads), so that a lost rank can be replaced (``run(...,
on_rank_loss="replace")``); a plain loop does neither. The table gives the
median time per iteration of each and the median of the per-block-pair ratios.
A benchmark, not a test: it prints, it asserts nothing.
"""

from __future__ import annotations

import sys
import time
from statistics import median

import numpy as np
from replicas import CASES  # the same cases as bench/replicas.py (this script's folder)


def _ranks(kv, case, pairs):
    """Alternate a block in ``kv.steps`` and a block in a plain loop; seconds per iteration."""
    sizes, n = CASES[case]
    keys = [f"{case}-{i}" for i in range(len(sizes))]
    values = [np.ones(size, np.float32) for size in sizes]
    outs = [np.empty(size, np.float32) for size in sizes]
    kv.init(keys, [np.zeros(size, np.float32) for size in sizes])
    kv.barrier()
    times = {"steps": [], "plain": []}
    for _ in range(pairs):
        for how in ("steps", "plain"):
            loop = kv.steps(n) if how == "steps" else range(n)
            kv.barrier()
            start = time.perf_counter()
            for _ in loop:
                kv.push(keys, values)
                kv.pull(keys, out=outs)
            kv.barrier()
            times[how].append((time.perf_counter() - start) / n)
    return times


def main() -> None:
    from labkv.cluster import connect, run

    quick = "--quick" in sys.argv
    pairs = 5 if quick else 15
    with connect(n_workers=2, threads_per_worker=1) as handle:
        print(f"W=2 ranks, S=2 servers, {pairs} block pairs per case, medians")
        print(f"{'case':<11} {'steps ms':>9} {'plain ms':>9} {'steps/plain':>12}")
        for case in CASES:
            out = run(_ranks, num_workers=2, cluster=handle, args=(case, pairs))
            steps, plain = out[0]["steps"], out[0]["plain"]
            ratio = median(s / p for s, p in zip(steps, plain, strict=True))
            print(
                f"{case:<11} {median(steps) * 1e3:>9.3f} {median(plain) * 1e3:>9.3f} {ratio:>12.2f}"
            )


if __name__ == "__main__":
    main()
