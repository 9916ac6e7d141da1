"""A 2-worker GPU cluster, as users start one, checked end to end on real CUDA.

    python bench/gpu_cluster.py

With dask-cuda installed: its ``LocalCUDACluster`` (every worker sees all GPUs, its
own first). Without: a ``LocalCluster`` whose workers are pinned by
``CUDA_VISIBLE_DEVICES`` (worker ``i`` sees GPU ``i % n`` only). Checks, printing
one line each and exiting 1 when any fails:

- each GPU server uses its worker's own GPU, and the placement names its PCI bus
  id; with two GPUs or more, the two servers use two different physical GPUs;
- dist_sync with CuPy pushes from 2 ranks (a key sliced over both servers and a
  scalar key) gives the sum on every rank;
- the servers' events (watched from here) carry finite value summaries, made on
  the servers' GPUs.

Run by ``bench/gpu_check.sh``; not a test (the test suite never needs a GPU).
"""

from __future__ import annotations

import copy
import math
import sys
import time

import numpy as np

SHAPE = (1000, 1001)  # above the big-array bound: one slice per server


def _own_gpu() -> str:
    import cupy

    return cupy.cuda.Device(0).pci_bus_id


def _ranks(kv) -> dict:
    import cupy

    grad = cupy.full(SHAPE, kv.rank + 1.0, dtype=cupy.float32)
    out = cupy.empty(SHAPE, dtype=cupy.float32)
    for _ in range(3):
        kv.push("w", grad)
        kv.pull("w", out=out)
    kv.push("s", cupy.array(kv.rank + 1.0, dtype=cupy.float32))
    return {"w": (float(out.min()), float(out.max())), "s": float(kv.pull("s"))}


def _pinned_cluster(n_workers: int, count: int):
    from distributed import LocalCluster

    class Pinned(LocalCluster):
        def new_worker_spec(self):
            ((name, spec),) = super().new_worker_spec().items()
            spec = copy.deepcopy(spec)
            spec["options"]["env"] = {"CUDA_VISIBLE_DEVICES": str(int(name) % count)}
            return {name: spec}

    cluster = Pinned(n_workers=0, threads_per_worker=1, dashboard_address=None)
    cluster.scale(n_workers)
    return cluster


def main() -> int:
    import labkv
    from labkv.cluster import connect, run

    count = labkv.num_gpus()
    try:
        from dask_cuda import LocalCUDACluster

        setup = "dask-cuda LocalCUDACluster"
        cluster = LocalCUDACluster(n_workers=2, threads_per_worker=1, dashboard_address=None)
    except ImportError:
        setup = "LocalCluster, workers pinned by CUDA_VISIBLE_DEVICES"
        cluster = _pinned_cluster(2, count)
    failed = 0

    def check(ok: bool, what: str) -> None:
        nonlocal failed
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}")

    print(f"== {setup}, {count} GPU(s) on this machine")
    with cluster, connect(cluster.scheduler_address, n_workers=2, set_as_default=False) as handle:
        own = handle.client.run(_own_gpu)
        print(f"   each worker's own GPU: {own}")
        kv = labkv.create("dist_sync", cluster=handle, num_servers=2, server_device="gpu")
        try:
            events = []
            kv.events.subscribe(events.append)
            kv.init(["w", "s"], [np.zeros(SHAPE, np.float32), np.array(0, np.float32)])
            pieces = kv.placement()["w"]
            names = [p["device"].split("@") for p in pieces]
            print(f"   placement of 'w': {[p['device'] for p in pieces]}")
            check(
                all(name == f"gpu(0) pci:{own[worker]}" for name, worker in names),
                "every server uses its worker's own GPU, named by its PCI bus id",
            )
            if len(set(own.values())) >= 2:
                used = {name.split("pci:")[1] for name, _ in names}
                check(len(used) == 2, "the two servers use two physical GPUs")
            results = run(_ranks, num_workers=2, kvstore=kv)
            print(f"   ranks: {results}")
            check(
                all(r == {"w": (3.0, 3.0), "s": 3.0} for r in results),
                "every rank pulls the sum of both ranks' pushes",
            )
            deadline = time.monotonic() + 5  # server events arrive in batches
            while time.monotonic() < deadline and not any(e.server is not None for e in events):
                time.sleep(0.1)
            summaries = [e.summary for e in events if e.server is not None and e.summary]
            check(
                bool(summaries) and all(math.isfinite(s["norm"]) for s in summaries),
                f"{len(summaries)} server events with value summaries, all finite",
            )
        finally:
            kv.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
