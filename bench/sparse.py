"""Row-sparse against dense push+pull of one embedding table, measured in one run.

    python bench/sparse.py [--quick]

A 1,000,000 x 64 float32 table (256 MB), 1,000 rows touched per step, W = 2 ranks
(``labkv.cluster.run``) on an embedded 2-worker LocalCluster, S = 2 servers (the table
sliced by rows over both), SGD on the servers. Each rank pushes a row-sparse gradient of
its 1,000 rows and ``row_sparse_pull``-s them, against a dense push of the whole table's
gradient and a dense pull of it, in the same run on the same servers. Bytes per step are
the servers' own counters (``kv.server_load()``: bytes in + out, both ranks); time per
step is the slower rank's. A benchmark, not a test: it prints the table and the ratios.
"""

from __future__ import annotations

import sys
import time

import numpy as np

ROWS, WIDTH, TOUCHED = 1_000_000, 64, 1_000


def _bytes(kv) -> int:
    return sum(s["bytes_in"] + s["bytes_out"] for s in kv.server_load())


def _phase(kv, steps, step_fn):
    """``steps`` steps of ``step_fn(i)`` between barriers: (seconds per step, server
    bytes per step as rank 0 reads them)."""
    step_fn(-1)  # warm up
    kv.barrier()
    before = _bytes(kv) if kv.rank == 0 else 0
    kv.barrier()
    t = time.perf_counter()
    for i in range(steps):
        step_fn(i)
    elapsed = (time.perf_counter() - t) / steps
    kv.barrier()
    moved = (_bytes(kv) - before) / steps if kv.rank == 0 else 0
    kv.barrier()
    return elapsed, moved


def _rank(kv, sparse_steps, dense_steps):
    import labkv.sparse as sparse

    shape = (ROWS, WIDTH)
    kv.init("e", sparse.zeros("row_sparse", shape))
    kv.init("d", np.zeros(shape, np.float32))
    kv.set_optimizer("sgd", learning_rate=0.01)
    kv.barrier()
    rng = np.random.default_rng(kv.rank)
    out = sparse.zeros("row_sparse", shape)

    def sparse_step(i):
        rows = np.sort(rng.choice(ROWS, TOUCHED, replace=False))
        data = rng.standard_normal((TOUCHED, WIDTH)).astype(np.float32)
        kv.push("e", sparse.row_sparse_array((data, rows), shape=shape))
        kv.row_sparse_pull("e", out=out, row_ids=rows)

    grad, dense_out = np.ones(shape, np.float32), np.empty(shape, np.float32)

    def dense_step(i):
        kv.push("d", grad)
        kv.pull("d", out=dense_out)

    return _phase(kv, sparse_steps, sparse_step), _phase(kv, dense_steps, dense_step)


def main(quick: bool = False) -> None:
    from labkv.cluster import connect, run

    sparse_steps, dense_steps = (10, 2) if quick else (50, 5)
    with connect(n_workers=2, dashboard_address=None, memory_limit="6GiB") as handle:
        results = run(_rank, 2, "dist_sync", 2, handle, args=(sparse_steps, dense_steps))
    (s_time, s_bytes), (d_time, d_bytes) = results[0]
    s_time = max(r[0][0] for r in results)
    d_time = max(r[1][0] for r in results)
    print(f"{ROWS:,} x {WIDTH} float32, {TOUCHED:,} rows touched per step, W = 2, S = 2")
    print(f"{'case':<28} {'server bytes / step':>20} {'ms / step':>10}")
    print(f"{'row-sparse push + rsp pull':<28} {s_bytes:>20,.0f} {s_time * 1e3:>10.2f}")
    print(f"{'dense push + pull':<28} {d_bytes:>20,.0f} {d_time * 1e3:>10.2f}")
    print(f"{'dense / row-sparse':<28} {d_bytes / s_bytes:>19.0f}x {d_time / s_time:>9.0f}x")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
