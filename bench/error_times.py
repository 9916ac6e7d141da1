"""How soon a store reports the loss of every replica of a server, against its timeout.

    python bench/error_times.py [--repeat 3] [--timeout 30]

On an embedded 3-worker cluster, a ``dist_sync`` store with one server and
``replicas=2`` is made; both replicas' workers are SIGKILLed and the store is
pushed and pulled until it raises. Printed for each try: the seconds from the
kills to the error, and their ratio to the store's ``timeout`` (an error
after it would be a wait timed out, not the loss seen). The test
(tests/test_cluster_replicas_dask.py) checks the error and that it came
before the timeout; how much before is measured here. On a busy machine run
it beside the same load for a baseline.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import numpy as np


def _pid() -> int:
    return os.getpid()


def every_replica_lost(handle, timeout: float) -> tuple[float, str]:
    import labkv
    from labkv.cluster import ClusterError

    handle.client.wait_for_workers(3, timeout=120)
    kv = labkv.create("dist_sync", cluster=handle, num_servers=1, replicas=2, timeout=timeout)
    try:
        kv.init(0, np.zeros(2))
        replicas = kv.placement()[0][0]["replicas"]
        pids = handle.client.run(_pid, workers=replicas)
        for address in replicas:
            os.kill(pids[address], signal.SIGKILL)
        start = time.perf_counter()
        try:
            while True:
                kv.push(0, np.ones(2))
                kv.pull(0)
        except ClusterError as exc:
            return time.perf_counter() - start, str(exc).splitlines()[0][:100]
    finally:
        kv.close()


def main() -> None:
    from labkv.cluster import connect

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()
    with connect(n_workers=3, dashboard_address=None) as handle:
        for i in range(args.repeat):
            took, error = every_replica_lost(handle, args.timeout)
            print(
                f"try {i}: every replica lost -> error in {took:5.1f} s "
                f"({took / args.timeout:.2f}x of the {args.timeout:.0f} s timeout): {error}",
                flush=True,
            )


if __name__ == "__main__":
    main()
