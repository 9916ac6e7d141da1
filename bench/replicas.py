"""What replicas cost: push+pull (and the barrier) with ``replicas=2`` against
``replicas=1``, measured in alternating blocks inside the same ranks (dist_sync;
``--kind``: dist_async, or dist_ssp with staleness 1).

    python bench/replicas.py [--quick] [--replicas=R] [--kind=dist_async|dist_ssp]

W = 2 ranks on an embedded LocalCluster of max(2, R) workers (with R = 2,
every backup is on the other worker). Two stores with the same servers count
S are made beside each other, one with ``replicas=1`` and one with
``replicas=R`` (default 2); each rank then runs
blocks of iterations on one store and then the other, many times, and the
table gives the median time per iteration of each and the median of the
per-block-pair ratios. Alternating blocks makes the ratio robust to the load
of a shared machine drifting during the run, which ``bench/dist.py``'s
separate runs are not. ``R=1 CPU ms`` is the CPU time the two worker
processes (ranks and servers together) spent per iteration, and ``CPU R/1``
the ratio of it with R replicas: where the CPU time is about cores x wall time
and its ratio is close to the time ratio, the replicas' extra work, not their
waiting, sets the cost. A benchmark, not a test: it prints, it asserts nothing.
"""

from __future__ import annotations

import os
import sys
import time
from statistics import median

import numpy as np

MIB = 1 << 20
CASES = {
    "16MiB x1": ([4 * MIB], 3),
    "4MiB x4": ([MIB] * 4, 3),
    "1KiB x200": ([256] * 200, 10),
    "tiny": ([1], 100),
    "barrier": ([], 100),  # kv.barrier() alone
}


def _ranks(kv, specs, case, pairs):
    """Alternate blocks on the store with one replica and the one with two;
    per block pair, the seconds per iteration of each, and the CPU seconds per
    iteration of this rank's worker process (its servers included)."""
    from labkv.cluster._runtime.links import new_store

    sizes, block = CASES[case]
    stores = [
        new_store(spec, servers, kv.rank, kv.num_workers, owner=kv.rank == 0)
        for spec, servers in specs
    ]
    keys = list(range(len(sizes)))
    grads = [np.ones(n, dtype=np.float32) for n in sizes]
    outs = [np.empty(n, dtype=np.float32) for n in sizes]

    def iteration(store):
        if keys:
            store.push(keys, grads)
            store.pull(keys, out=outs)
        else:
            store.barrier()

    for store in stores:
        if keys:
            store.init(keys, [np.zeros(n, dtype=np.float32) for n in sizes])
        for _ in range(2):
            iteration(store)
    kv.barrier()
    times = []
    for _ in range(pairs):
        pair = []
        for store in stores:
            t, cpu = time.perf_counter(), time.process_time()
            for _ in range(block):
                iteration(store)
            pair.append(((time.perf_counter() - t) / block, (time.process_time() - cpu) / block))
        times.append(pair)
    return times


def main(quick: bool = False, replicas: int = 2, kind: str = "dist_sync") -> None:
    import labkv
    from labkv.cluster import connect, run

    pairs = 5 if quick else 15
    extra = {"staleness": 1} if kind == "dist_ssp" else {}
    workers = max(2, replicas)
    with connect(n_workers=workers, dashboard_address=None) as handle:
        print(
            f"{kind}{' (staleness 1)' if kind == 'dist_ssp' else ''}, W = 2 ranks on "
            f"{workers} workers, push+pull per iteration; "
            f"replicas = {replicas} keeps each server's copies on {replicas} workers"
        )
        print(
            f"(median of {pairs} alternating block pairs per case; {os.cpu_count()} CPU cores here)"
        )
        r_ms, ratio_name, cpu_name = f"R={replicas} ms", f"R={replicas} / R=1", "CPU R/1"
        print(
            f"{'case':<12}{'S':>3}{'R=1 ms':>10}{r_ms:>10}{ratio_name:>11}"
            f"{'R=1 CPU ms':>12}{cpu_name:>9}"
        )
        for servers in (1, 2):
            for case in CASES:
                made = [
                    labkv.create(kind, cluster=handle, num_servers=servers, replicas=r, **extra)
                    for r in (1, replicas)
                ]
                for store in made:
                    store.configure_ranks(2)
                specs = [
                    (store.spec, store.servers if r == 1 else [])
                    for r, store in zip((1, replicas), made)
                ]
                per_rank = run(_ranks, num_workers=2, cluster=handle, args=(specs, case, pairs))
                # per pair, the slower rank's time (the ranks wait for each other)
                # and the CPU of both ranks' processes
                pair_times = [
                    [max(rank[i][r][0] for rank in per_rank) for r in (0, 1)] for i in range(pairs)
                ]
                pair_cpu = [
                    [sum(rank[i][r][1] for rank in per_rank) for r in (0, 1)] for i in range(pairs)
                ]
                one = median(t[0] for t in pair_times)
                two = median(t[1] for t in pair_times)
                ratio = median(t[1] / t[0] for t in pair_times)
                one_cpu = median(c[0] for c in pair_cpu)
                cpu = median(c[1] / c[0] for c in pair_cpu)
                print(
                    f"{case:<12}{servers:>3}{one * 1e3:>10.2f}{two * 1e3:>10.2f}"
                    f"{ratio:>11.2f}{one_cpu * 1e3:>12.2f}{cpu:>9.2f}"
                )
                for store in made:
                    store.close()


def _option(name: str, default: str) -> str:
    given = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith(f"--{name}=")]
    return given[-1] if given else default


if __name__ == "__main__":
    main(
        quick="--quick" in sys.argv,
        replicas=int(_option("replicas", "2")),
        kind=_option("kind", "dist_sync"),
    )
