"""What silent peers cost a worker: N comms that send a stream's hello and
then nothing, against N plain Dask comms, on a 1-worker embedded cluster with
a store on it. Prints the worker's extra fds and RSS for each, and whether the
store answered meanwhile (a push+pull, its seconds).

    python bench/idle_streams.py 300 500
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np


def usage(dask_worker=None):
    import psutil

    return len(os.listdir("/proc/self/fd")), psutil.Process().memory_info().rss


async def open_comms(address, connection_args, n, hello):
    from distributed.comm import connect

    comms = []
    for _ in range(n):
        comm = await connect(address, **connection_args)
        comms.append(comm)
        if hello:
            await comm.write({"op": "labkv_stream", "reply": False, "framing": "socket"})
            await comm.read()
    return comms


def measure(handle, kv, address, n, hello):
    client = handle.client
    client.run(lambda: __import__("gc").collect(), workers=[address])
    fds0, rss0 = client.run(usage, workers=[address])[address]
    comms = client.sync(open_comms, address, client.connection_args, n, hello)
    time.sleep(1.0)
    fds1, rss1 = client.run(usage, workers=[address])[address]
    start = time.perf_counter()
    kv.push("w", np.ones(3, np.float32))
    ok = bool((kv.pull("w") == 1).all())
    took = time.perf_counter() - start
    for comm in comms:
        comm.abort()
    what = "labkv hello" if hello else "plain Dask"
    print(
        f"{n:4d} {what:12s} comms: worker fds +{fds1 - fds0:4d} ({(fds1 - fds0) / n:.2f} each), "
        f"RSS +{(rss1 - rss0) / 2**20:6.1f} MiB; store answered: {ok} in {took:.2f} s",
        flush=True,
    )


def main(counts):
    import labkv
    from labkv.cluster import connect

    with connect(n_workers=1, dashboard_address=None) as handle:
        kv = labkv.create("dist_sync", cluster=handle, num_servers=1)
        kv.init("w", np.zeros(3, np.float32))
        address = kv._links[0].address
        for n in counts:
            for hello in (False, True):
                measure(handle, kv, address, n, hello)
                time.sleep(1.0)
        kv.close()


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [300, 500])
