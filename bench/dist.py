"""Benchmark of the dist_sync store against a raw Dask echo, measured in one run.

    python bench/dist.py [--quick] [--dask-malloc] [--only=16MiB x1,tiny] [--repeats=3]

W = 2 ranks (``labkv.cluster.run``) on an embedded 2-worker LocalCluster, with
S = 1 and S = 2 servers, each also with ``replicas=2`` (every server's backup on
the other worker): push+pull per iteration of a 16 MiB model (1 key; 1
key whose pushes travel 2-bit compressed; 4 keys of 4 MiB), 200 keys x 1 KiB,
one tiny key, and a barrier. The baseline is
a task on one worker echoing the same bytes through one call to the other
worker: to an async actor method (what labkv's servers are), and to a plain
worker comm handler (the "worker extension" alternative). The echo runs on the
store's own cluster (whose workers reuse big buffers, see
``labkv.cluster._runtime.connect._MALLOC_ENV``) and once more on a cluster with Dask's
default worker environment (every buffer over 128 KiB a fresh mmap), the
baseline as Dask ships. Each rank also counts its worker process's page faults
(``ru_minflt``) per iteration: the rank and its worker's server share the
process. ``--dask-malloc`` runs the store itself on Dask's default worker
environment too (what it measured before the embedded workers reused buffers).
A benchmark, not a test: it prints tables, it asserts nothing. dist_ssp against
dist_async, per call with no pull waiting, is ``bench/ssp.py``.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import time
from statistics import median

import numpy as np

MIB = 1 << 20


class Echo:
    """The baseline's actor: returns what it gets."""

    async def echo(self, data):
        return data


def _actor_echo(actor, nbytes, iters):
    data = np.ones(nbytes // 4, dtype=np.float32)
    actor.echo(data).result()
    t = time.perf_counter()
    for _ in range(iters):
        actor.echo(data).result()
    return (time.perf_counter() - t) / iters


def _install_handler(dask_worker):
    from distributed.protocol import to_serialize

    async def echo(comm=None, data=None):
        return {"data": to_serialize(data)}

    dask_worker.handlers["labkv_bench_echo"] = echo


def _handler_echo(address, nbytes, iters):
    from distributed import get_worker
    from distributed.protocol import to_serialize
    from distributed.utils import sync

    worker = get_worker()
    data = np.ones(nbytes // 4, dtype=np.float32)

    async def once():
        return await worker.rpc(address).labkv_bench_echo(data=to_serialize(data))

    sync(worker.loop, once)
    t = time.perf_counter()
    for _ in range(iters):
        sync(worker.loop, once)
    return (time.perf_counter() - t) / iters


def _ranks(kv, case, iters):
    """One rank's loop; ``(seconds per iteration, per-server load per iteration)``
    (the load, from the servers' own byte counters, only on rank 0)."""
    if case == "barrier":
        kv.barrier()
        t = time.perf_counter()
        for _ in range(iters):
            kv.barrier()
        return (time.perf_counter() - t) / iters, None, None
    sizes = {
        "16MiB x1": [4 * MIB] * 1,
        "16MiB 2bit": [4 * MIB] * 1,
        "4MiB x4": [MIB] * 4,
        "1KiB x200": [256] * 200,
        "tiny": [1],
    }[case]
    keys = list(range(len(sizes)))
    if case.endswith("2bit"):  # pushes travel packed, 2 bits a value; pulls as float32
        kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    kv.init(keys, [np.zeros(n, dtype=np.float32) for n in sizes])
    grads = [np.ones(n, dtype=np.float32) for n in sizes]
    outs = [np.empty(n, dtype=np.float32) for n in sizes]
    for _ in range(2):  # warm up
        kv.push(keys, grads)
        kv.pull(keys, out=outs)
    kv.barrier()
    before = kv.server_load() if kv.rank == 0 else None
    kv.barrier()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = time.perf_counter()
    for _ in range(iters):
        kv.push(keys, grads)
        kv.pull(keys, out=outs)
    elapsed = (time.perf_counter() - t) / iters
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / iters
    kv.barrier()
    if kv.rank != 0:
        return elapsed, None, faults
    after = kv.server_load()
    load = [
        (
            (a["bytes_in"] - b["bytes_in"]) / iters,
            (a["bytes_out"] - b["bytes_out"]) / iters,
        )
        for a, b in zip(after, before, strict=True)
    ]
    return elapsed, load, faults


#: the echoes of the baseline: (label, bytes, calls)
ECHOES = (("16MiB", 16 * MIB, 30), ("tiny", 4, 400))


def _echo_of(case: str) -> tuple[str, int, int]:
    """The echo a case is compared with: 16 MiB for the MiB models, else tiny."""
    return ECHOES[0] if "MiB" in case else ECHOES[1]


def _best_of_3(client, worker: str, echo, *args) -> float:
    """The fastest of three runs of an echo task on ``worker`` (seconds per call)."""
    return min(client.submit(echo, *args, workers=[worker], pure=False).result() for _ in range(3))


@contextlib.contextmanager
def _cluster(dask_malloc: bool):
    """An embedded 2-worker cluster: labkv's worker environment, or Dask's
    default one (its MALLOC_TRIM_THRESHOLD_ freezes glibc's mmap threshold at
    128 KiB, which the mmap threshold below restates, so overriding labkv's)."""
    import dask

    from labkv.cluster import connect

    if not dask_malloc:
        with connect(n_workers=2, dashboard_address=None) as handle:
            yield handle
        return
    default = {"distributed.nanny.pre-spawn-environ.MALLOC_MMAP_THRESHOLD_": 128 << 10}
    # A Nanny copies its pre-spawn environment into this process's os.environ,
    # which wins over the config for the clusters started after it: restore it.
    saved = dict(os.environ)
    try:
        with dask.config.set(default), connect(n_workers=2, dashboard_address=None) as handle:
            yield handle
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _default_environ_echo(scale: int) -> dict[str, float]:
    """The actor echo (16 MiB, tiny) on a cluster with Dask's default worker environment."""
    with _cluster(dask_malloc=True) as handle:
        client = handle.client
        a, b = handle.workers()
        actor = client.submit(Echo, actor=True, workers=[b], pure=False).result()
        return {
            label: _best_of_3(client, a, _actor_echo, actor, nbytes, iters // scale)
            for label, nbytes, iters in ECHOES
        }


def main(
    quick: bool = False, dask_malloc: bool = False, repeats: int = 3, only: list[str] | None = None
) -> None:
    from labkv.cluster import run

    scale = 4 if quick else 1
    dask_default = _default_environ_echo(scale)
    with _cluster(dask_malloc) as handle:
        client = handle.client
        a, b = handle.workers()
        actor = client.submit(Echo, actor=True, workers=[b], pure=False).result()
        client.run(_install_handler, workers=[b])
        base = {}
        for label, nbytes, iters in ECHOES:
            base[("actor", label)] = _best_of_3(
                client, a, _actor_echo, actor, nbytes, iters // scale
            )
            base[("handler", label)] = _best_of_3(
                client, a, _handler_echo, b, nbytes, iters // scale
            )
        cases = [
            ("16MiB x1", 30),
            ("16MiB 2bit", 30),
            ("4MiB x4", 30),
            ("1KiB x200", 200),
            ("tiny", 500),
            ("barrier", 500),
        ]
        if only:
            cases = [(case, iters) for case, iters in cases if case in only]
        rows, replicated = [], {}
        for case, iters in cases:
            times: dict[int, list[float]] = {1: [], 2: []}
            ratios: dict[int, list[float]] = {1: [], 2: []}
            faults: dict[int, list[float]] = {1: [], 2: []}
            with_replicas: dict[int, list[float]] = {1: [], 2: []}
            loads = {}
            _, nbytes, echo_iters = _echo_of(case)
            for _ in range(repeats):
                # The echo right before S = 1 and S = 2: all three see the same load of
                # this shared machine, and each ratio is taken within one such block.
                echo = client.submit(
                    _actor_echo, actor, nbytes, echo_iters // scale, workers=[a], pure=False
                ).result()
                for servers in (1, 2):
                    per_rank = run(
                        _ranks,
                        num_workers=2,
                        num_servers=servers,
                        cluster=handle,
                        args=(case, max(5, iters // scale)),
                    )
                    t = max(t for t, _, _ in per_rank)
                    times[servers].append(t)
                    ratios[servers].append(t / echo)
                    loads[servers] = per_rank[0][1]
                    if per_rank[0][2] is not None:
                        faults[servers].append(max(f for _, _, f in per_rank))
                    # The same with every server replicated on the other worker.
                    per_rank = run(
                        _ranks,
                        num_workers=2,
                        num_servers=servers,
                        replicas=2,
                        cluster=handle,
                        args=(case, max(5, iters // scale)),
                    )
                    with_replicas[servers].append(max(t for t, _, _ in per_rank))
            replicated[case] = {n: median(ts) for n, ts in with_replicas.items()}
            rows.append(
                (
                    case,
                    median(times[1]),
                    median(times[2]),
                    median(ratios[1]),
                    median(ratios[2]),
                    loads,
                    faults,
                )
            )
    echo16, echo_tiny = base[("actor", "16MiB")], base[("actor", "tiny")]
    print("raw Dask echo, task on worker A -> worker B -> back (ms per call, best of 3):")
    print(f"  async actor method : 16 MiB {echo16 * 1e3:7.2f}   tiny {echo_tiny * 1e3:6.3f}")
    print(
        f"  worker comm handler: 16 MiB {base[('handler', '16MiB')] * 1e3:7.2f}   "
        f"tiny {base[('handler', 'tiny')] * 1e3:6.3f}"
    )
    print(
        f"  actor, Dask's default worker environment: 16 MiB "
        f"{dask_default['16MiB'] * 1e3:7.2f}   tiny {dask_default['tiny'] * 1e3:6.3f}"
    )
    print()
    workers = "Dask's default" if dask_malloc else "labkv's (buffers reused)"
    print(f"store on a cluster with {workers} worker environment")
    print(
        f"labkv dist_sync, W = 2 ranks, push+pull per iteration (ms, median of {repeats} runs;\n"
        "ratio to the actor echo of the same bytes (16 MiB or tiny) measured just before, median;\n"
        "x dflt: ratio to the echo on Dask's default worker environment)"
    )
    print(
        f"{'case':<12}{'S=1 ms':>10}{'S=2 ms':>10}{'S=1 x echo':>12}{'S=2 x echo':>12}"
        f"{'S=1 x dflt':>12}{'S=2 x dflt':>12}"
    )
    for case, t1, t2, r1, r2, _, _ in rows:
        dflt = dask_default[_echo_of(case)[0]]
        print(
            f"{case:<12}{t1 * 1e3:>10.2f}{t2 * 1e3:>10.2f}{r1:>12.2f}{r2:>12.2f}"
            f"{t1 / dflt:>12.2f}{t2 / dflt:>12.2f}"
        )
    print()
    print("replicas = 2 (each server's backup on the other worker), ms and ratio to replicas = 1:")
    print(f"{'case':<12}{'S=1 R=2':>10}{'S=2 R=2':>10}{'S=1 R2/R1':>11}{'S=2 R2/R1':>11}")
    for case, t1, t2, *_ in rows:
        r1, r2 = replicated[case][1], replicated[case][2]
        print(f"{case:<12}{r1 * 1e3:>10.2f}{r2 * 1e3:>10.2f}{r1 / t1:>11.2f}{r2 / t2:>11.2f}")
    print()
    print("per-server traffic per iteration (MiB in / out, from the servers' byte counters):")
    for case, *_, loads, _ in rows:
        if loads[1] is None:
            continue
        cells = []
        for servers in (1, 2):
            cells.append(
                "  ".join(
                    f"s{s} {i / MIB:6.2f}/{o / MIB:6.2f}" for s, (i, o) in enumerate(loads[servers])
                )
            )
        print(f"  {case:<12} S=1: {cells[0]:<24} S=2: {cells[1]}")

    print()
    print("page faults per iteration (the busier of the two worker processes, median):")
    for case, *_, faults in rows:
        if faults[1]:
            print(f"  {case:<12} S=1: {median(faults[1]):8.0f}   S=2: {median(faults[2]):8.0f}")


if __name__ == "__main__":
    # --only=16MiB x1,tiny runs those cases; --repeats=5 runs each 5 times
    options = dict(a.removeprefix("--").split("=", 1) for a in sys.argv[1:] if "=" in a)
    main(
        quick="--quick" in sys.argv,
        dask_malloc="--dask-malloc" in sys.argv,
        repeats=int(options.get("repeats", 3)),
        only=options["only"].split(",") if "only" in options else None,
    )
