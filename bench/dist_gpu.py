"""dist_sync with CuPy pushes, servers on the host vs on the workers' GPUs.

    python bench/dist_gpu.py [--quick]

Needs CuPy and a CUDA GPU on the workers (run by ``bench/gpu_check.sh``). W = 2
ranks on an embedded 2-worker LocalCluster push and pull a CuPy model (16 MiB
and 64 MiB, one key) with S = 1 and S = 2 servers, ``server_device='cpu'`` and
``'gpu'``. Each rank checks every pulled value (the sum of both ranks' pushes).
Printed beside them, measured in the same run on a rank's worker: the bound of
a host transport, one device->host copy of the gradient plus one host->device
copy of the pulled value. A benchmark, not a test.
"""

from __future__ import annotations

import statistics
import sys
import time

MIB = 1 << 20


def _ranks(kv, nbytes: int, iters: int) -> float:
    import cupy

    n = nbytes // 4
    kv.init("w", cupy.zeros(n, dtype=cupy.float32))
    grad = cupy.full(n, kv.rank + 1.0, dtype=cupy.float32)
    out = cupy.empty(n, dtype=cupy.float32)
    expected = float(sum(r + 1 for r in range(kv.num_workers)))
    kv.push("w", grad)
    kv.pull("w", out=out)
    kv.barrier()
    t = time.perf_counter()
    for _ in range(iters):
        kv.push("w", grad)
        kv.pull("w", out=out)
    cupy.cuda.Device().synchronize()
    elapsed = (time.perf_counter() - t) / iters
    low, high = float(out.min()), float(out.max())
    if (low, high) != (expected, expected):
        raise AssertionError(f"rank {kv.rank} pulled [{low}, {high}], expected {expected}")
    kv.barrier()
    return elapsed


def _copy_bound(nbytes: int, iters: int) -> float:
    import cupy

    grad = cupy.ones(nbytes // 4, dtype=cupy.float32)
    host = grad.get()
    out = cupy.empty_like(grad)
    t = time.perf_counter()
    for _ in range(iters):
        grad.get(out=host)
        out.set(host)
    cupy.cuda.Device().synchronize()
    return (time.perf_counter() - t) / iters


def main(quick: bool = False) -> None:
    import labkv
    from labkv.cluster import connect, run

    print(f"GPUs: {labkv.num_gpus()}")
    iters = 5 if quick else 20
    with connect(n_workers=2, dashboard_address=None) as handle:
        a = handle.workers()[0]
        print(f"{'model':<8}{'servers':<16}{'S=1 ms':>10}{'S=2 ms':>10}{'GB/s S=2':>10}")
        for nbytes in (16 * MIB, 64 * MIB):
            # measured first, alone: a rank's worker runs one task at a time
            bound = handle.client.submit(
                _copy_bound, nbytes, iters, workers=[a], pure=False
            ).result()
            for device in ("cpu", "gpu"):
                times = {}
                for servers in (1, 2):
                    per_rank = [
                        max(
                            run(
                                _ranks,
                                num_workers=2,
                                num_servers=servers,
                                cluster=handle,
                                args=(nbytes, iters),
                                server_device=device,
                            )
                        )
                        for _ in range(1 if quick else 3)
                    ]
                    times[servers] = statistics.median(per_rank)
                rate = 2 * nbytes / times[2] / 1e9  # a rank's bytes pushed + pulled per second
                print(
                    f"{nbytes // MIB:>4} MiB  {device + ' servers':<16}"
                    f"{times[1] * 1e3:>10.2f}{times[2] * 1e3:>10.2f}{rate:>10.2f}"
                )
            print(
                f"{nbytes // MIB:>4} MiB  copy bound: one device->host + host->device copy "
                f"{bound * 1e3:.2f} ms"
            )


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
