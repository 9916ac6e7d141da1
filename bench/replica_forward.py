"""What a replicated server's forward to its backup costs, beside the whole call.

    python bench/replica_forward.py

The notebook's own dist_sync store (one rank) on an embedded 2-worker cluster
makes 500 tiny push+pulls with ``replicas=1`` and with ``replicas=2``, twice
each, alternating. Each worker times every forward of a log entry from a
primary to its backup (wrapping ``Forwarder.send`` and ``Forwarder._forwarded``),
so the table sets the forward's median beside the time of a whole push+pull. A benchmark,
not a test: it prints, it asserts nothing.
"""

from __future__ import annotations

import time
from statistics import median

import numpy as np

CALLS = 500


def _time_forwards() -> None:
    """In a worker: keep the duration of every forward to a backup, from the
    entry sent to every backup's reply (``Forwarder.send`` to ``_forwarded``)."""
    from labkv.cluster._server.replication import forwarder as _forwarder

    send, forwarded = _forwarder.Forwarder.send, _forwarder.Forwarder._forwarded
    started: dict[tuple[int, int], float] = {}
    _forwarder.forward_times = []

    def timed_send(self, backups, entry):
        started[id(self), entry[0]] = time.perf_counter()
        return send(self, backups, entry)

    def timed_forwarded(self, backups, outcomes, index):
        start = started.pop((id(self), index), None)
        if start is not None:
            _forwarder.forward_times.append(time.perf_counter() - start)
        return forwarded(self, backups, outcomes, index)

    _forwarder.Forwarder.send = timed_send
    _forwarder.Forwarder._forwarded = timed_forwarded


def _take_forward_times() -> list[float]:
    from labkv.cluster._server.replication import forwarder as _forwarder

    times, _forwarder.forward_times = _forwarder.forward_times, []
    return times


def main() -> None:
    import labkv
    from labkv.cluster import connect

    with connect(n_workers=2, dashboard_address=None) as handle:
        handle.client.run(_time_forwards)
        print(f"dist_sync, one rank (this process), {CALLS} tiny push+pulls per row")
        print(f"{'replicas':>8}{'push+pull ms':>14}{'forward ms (median)':>21}{'forwards':>10}")
        for replicas in (1, 2, 1, 2):
            kv = labkv.create("dist_sync", cluster=handle, num_servers=1, replicas=replicas)
            kv.init(0, np.zeros(1, np.float32))
            grad, out = np.ones(1, np.float32), np.empty(1, np.float32)
            for _ in range(50):  # warm up
                kv.push(0, grad)
                kv.pull(0, out=out)
            handle.client.run(_take_forward_times)
            start = time.perf_counter()
            for _ in range(CALLS):
                kv.push(0, grad)
                kv.pull(0, out=out)
            per_call = (time.perf_counter() - start) / CALLS
            forwards = [t for ts in handle.client.run(_take_forward_times).values() for t in ts]
            forward = f"{median(forwards) * 1e3:.3f}" if forwards else "-"
            print(f"{replicas:>8}{per_call * 1e3:>14.3f}{forward:>21}{len(forwards):>10}")
            kv.close()


if __name__ == "__main__":
    main()
