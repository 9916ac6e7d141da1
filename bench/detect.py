"""How fast a lost worker is noticed, on a quiet machine and beside two CPU hogs.

    python bench/detect.py [--repeats=3] [--only=quiet|hogs]

Three times, each measured ``--repeats`` times per condition, the conditions
alternating (quiet, hogs, quiet, ...) so that a neighbour's load hurts both
alike:

- ``all replicas lost``: a ``dist_sync`` store made in this process, one
  server with ``replicas=2`` on a 4-worker embedded cluster; both replicas'
  workers are SIGKILLed, and the store pushes and pulls until the call fails
  with ``ClusterError: server 0 is lost: every replica of it is gone``.
  Printed: seconds from the second SIGKILL to that error.
- ``every replica lost, run``: ``run(loop, num_workers=2, num_servers=4,
  replicas=2)`` on 4 workers; the two workers of a server that host no rank
  are SIGKILLed (at once). Printed: seconds
  from the kills to ``run``'s error ("servers [s] lost with their keys'
  values and optimizer states").
- ``rank replaced``: ``run(train, num_workers=2, replicas=2,
  on_rank_loss="replace")`` on 4 workers (two spares); rank 1 SIGKILLs its
  own worker at step 10 (writing the time first). Printed: seconds from that
  kill to the replacement's first push.

``hogs``: two busy loops (``setsid python -c 'while True: pass'``, each its
own session, so that no scheduling group shields the cluster from them) run
beside the cluster for the whole measurement, and are killed after it.
A benchmark, not a test: it prints, it asserts nothing.
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _hogs import Hogs  # noqa: E402

import labkv  # noqa: E402
from labkv.cluster import ClusterError, connect, run  # noqa: E402
from tests.test_cluster_elastic_dask import train  # noqa: E402

KILL_STEP = 10
LOST = r"server 0 is lost: every replica of it is gone"


def _pid() -> int:
    return os.getpid()


def _cluster():
    return connect(n_workers=4, dashboard_address=None, memory_limit="1GiB", set_as_default=False)


def all_replicas_lost(handle) -> float:
    """Seconds from the SIGKILL of a server's last replica to the store's error."""
    handle.client.wait_for_workers(4, timeout=120)
    kv = labkv.create("dist_sync", cluster=handle, num_servers=1, replicas=2, timeout=120)
    try:
        kv.init(0, np.zeros(2))
        kv.push(0, np.ones(2))
        kv.pull(0)
        replicas = kv.placement()[0][0]["replicas"]
        pids = handle.client.run(_pid, workers=replicas)
        for address in replicas:
            os.kill(pids[address], signal.SIGKILL)
        killed = time.monotonic()
        try:
            while True:
                kv.push(0, np.ones(2))
                kv.pull(0)
        except ClusterError as exc:
            if "every replica of it is gone" not in str(exc):
                raise
            return time.monotonic() - killed
    finally:
        kv.close()


def _looping(kv, marker: str) -> None:
    """A rank's loop over 8 keys (on every server) until the run fails; it
    writes its worker's address to ``marker`` once it loops."""
    from distributed import get_worker

    keys = [f"k{i}" for i in range(8)]
    if kv.rank == 0:
        kv.init(keys, [np.zeros(4, np.float32)] * 8)
    kv.barrier()
    Path(f"{marker}-{kv.rank}").write_text(get_worker().address)
    while True:
        kv.push(keys, [np.ones(4, np.float32)] * 8)
        kv.pull(keys[0])


def all_replicas_lost_in_run(handle, tmp: Path) -> float:
    """Seconds from the SIGKILL of a server's last replica to ``run``'s error:
    2 ranks, 4 servers with 2 replicas each on 4 workers (replica r of server
    s on the sorted workers' ``(s + r) % 4``); the two workers of a server
    that host no rank are killed."""
    handle.client.wait_for_workers(4, timeout=120)
    marker = str(tmp / f"looping-{time.monotonic_ns()}")
    outcome: list[BaseException] = []

    def go() -> None:
        try:
            run(
                _looping,
                num_workers=2,
                cluster=handle,
                num_servers=4,
                replicas=2,
                timeout=120,
                args=(marker,),
            )
        except BaseException as exc:
            outcome.append(exc)
            ended.append(time.monotonic())

    ended: list[float] = []
    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    while not all(Path(f"{marker}-{r}").exists() for r in (0, 1)):
        time.sleep(0.05)
    ranks = {Path(f"{marker}-{r}").read_text() for r in (0, 1)}
    workers = sorted(handle.workers())
    pairs = [{workers[s], workers[(s + 1) % 4]} for s in range(4)]
    doomed = next(p for p in pairs if not p & ranks)
    pids = handle.client.run(_pid, workers=sorted(doomed))
    time.sleep(1.0)
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    thread.join()
    if not outcome or "lost with their keys" not in str(outcome[0]):
        raise RuntimeError(f"the run ended otherwise: {outcome}")
    return ended[0] - killed


def rank_replaced(handle, tmp: Path) -> float:
    """Seconds from a rank's SIGKILL to its replacement's first push."""
    handle.client.wait_for_workers(4, timeout=120)
    marker = tmp / f"killed-{time.monotonic_ns()}"
    out = run(
        train,
        num_workers=2,
        cluster=handle,
        num_servers=2,
        replicas=2,
        on_rank_loss="replace",
        timeout=120,
        bigarray_bound=1000,
        kwargs={"kills": ((1, 0, KILL_STEP, 0, False),), "marker": str(marker)},
    )
    killed = float(Path(f"{marker}-1").read_text())
    incarnation, first_push = out[1][2], out[1][3]
    if incarnation < 1:
        raise RuntimeError("rank 1 was not replaced")
    return first_push - killed


def main(argv: list[str]) -> None:
    repeats, only = 3, ""
    for arg in argv:
        name, _, value = arg.removeprefix("--").partition("=")
        if name == "repeats":
            repeats = int(value)
        elif name == "only":
            only = value
        else:
            raise SystemExit(f"unknown option {arg!r}; see the docstring")
    conditions = [only] if only else ["quiet", "hogs"]
    names = ["all replicas lost", "every replica lost, run", "rank replaced"]
    times: dict[str, dict[str, list[float]]] = {c: {n: [] for n in names} for c in conditions}
    tmp = Path(tempfile.mkdtemp())
    print(f"load average before: {os.getloadavg()}")
    for i in range(repeats):
        for condition in conditions if i % 2 == 0 else conditions[::-1]:
            with Hogs(2 if condition == "hogs" else 0):
                for name, measure in (
                    ("all replicas lost", all_replicas_lost),
                    ("every replica lost, run", lambda h: all_replicas_lost_in_run(h, tmp)),
                    ("rank replaced", lambda h: rank_replaced(h, tmp)),
                ):
                    with _cluster() as handle:  # a fresh one: killed workers come back late
                        seconds = measure(handle)
                    times[condition][name].append(seconds)
                    print(
                        f"  {condition:>5} #{i}: {name}: {seconds:6.2f} s"
                        f"  (load average {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
    print(f"\n{repeats} repeats per condition: median [min .. max] seconds")
    print(f"{'':>30}  " + "  ".join(f"{c:>24}" for c in conditions))
    for name in names:
        cells = []
        for c in conditions:
            ts = sorted(times[c][name])
            cells.append(f"{statistics.median(ts):6.2f} [{ts[0]:5.2f} .. {ts[-1]:5.2f}]")
        print(f"{name:>30}  " + "  ".join(f"{cell:>24}" for cell in cells))


if __name__ == "__main__":
    main(sys.argv[1:])
