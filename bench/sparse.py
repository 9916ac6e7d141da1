"""Row-sparse against dense push+pull of one embedding table, measured in one run.

    python bench/sparse.py [--quick]

A 1,000,000 x 64 float32 table (256 MB), 1,000 rows touched per step, W = 2 ranks
(``labkv.cluster.run``) on an embedded 2-worker LocalCluster, S = 2 servers (the table
sliced by rows over both), SGD on the servers. Each rank pushes a row-sparse gradient of
its 1,000 rows and ``row_sparse_pull``-s them, against a dense push of the whole table's
gradient and a dense pull of it, in the same run on the same servers.

Then the same table as an ``nn.Embedding(sparse=True)`` trained through
``labkv.torch.DistributedOptimizer`` (torch SGD, ``update_on_kvstore=True``), each rank
looking up 1,000 rows a step, in two more runs on the same cluster (a store each): the table named by its
weight alone (``sparse_params=[emb.weight]``: ``step()`` pulls the whole table, what every
several-rank torch step pulled before lookups pulled their rows), against the module
(``sparse_params=emb``: each lookup pulls its rows first, ``step()`` pulls none).

Bytes per step are the servers' own counters (``kv.server_load()``: bytes in + out, both
ranks, before and after the steps); time per step is the slower rank's. A benchmark, not a
test: it prints the table and the ratios to the dense push + pull.
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


def _torch_rank(kv, by_module, steps):
    """``steps`` torch steps of an ``nn.Embedding(sparse=True)`` of the table through
    a DistributedOptimizer: (sparse_pull, seconds per step, bytes per step)."""
    import torch

    import labkv.torch as lkt

    torch.set_num_threads(1)
    rng = np.random.default_rng(100 + kv.rank)
    emb = torch.nn.Embedding(ROWS, WIDTH, sparse=True)
    sgd = torch.optim.SGD(emb.parameters(), lr=0.01)
    params = emb if by_module else [emb.weight]
    opt = lkt.DistributedOptimizer(sgd, kv, [("emb", emb.weight)], True, sparse_params=params)

    def step(i):
        ids = torch.from_numpy(rng.choice(ROWS, TOUCHED, replace=False))
        opt.zero_grad()
        emb(ids).pow(2).sum().backward()
        opt.step()

    measured = _phase(kv, steps, step)
    return (opt.sparse_pull["emb"], *measured)


def _row(case, moved, seconds, dense):
    return f"{case:<40} {moved:>16,.0f} {seconds * 1e3:>10.2f} {dense / moved:>13.0f}x"


def main(quick: bool = False) -> None:
    from labkv.cluster import connect, run

    sparse_steps, dense_steps = (10, 2) if quick else (50, 5)
    table_steps, batch_steps = (2, 10) if quick else (5, 50)
    with connect(n_workers=2, dashboard_address=None, memory_limit="6GiB") as handle:
        results = run(_rank, 2, "dist_sync", 2, handle, args=(sparse_steps, dense_steps))
        # a store per DistributedOptimizer: one run each
        by_weight = run(_torch_rank, 2, "dist_sync", 2, handle, args=(False, table_steps))
        by_module = run(_torch_rank, 2, "dist_sync", 2, handle, args=(True, batch_steps))
    (_, s_bytes), (_, d_bytes) = results[0]
    s_time = max(r[0][0] for r in results)
    d_time = max(r[1][0] for r in results)
    (table_how, _, t_bytes), (batch_how, _, b_bytes) = by_weight[0], by_module[0]
    t_time = max(r[1] for r in by_weight)
    b_time = max(r[1] for r in by_module)
    print(f"{ROWS:,} x {WIDTH} float32, {TOUCHED:,} rows touched per rank and step, W = 2, S = 2")
    print(f"{'case':<40} {'bytes / step':>16} {'ms / step':>10} {'dense / case':>14}")
    print(_row("dense push + pull", d_bytes, d_time, d_bytes))
    print(_row("row-sparse push + row_sparse_pull", s_bytes, s_time, d_bytes))
    print(_row(f"labkv.torch, weight alone ({table_how!r})", t_bytes, t_time, d_bytes))
    print(_row(f"labkv.torch, module ({batch_how!r})", b_bytes, b_time, d_bytes))
    print(f"labkv.torch: the module's lookups move {t_bytes / b_bytes:.0f}x fewer bytes a step")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
