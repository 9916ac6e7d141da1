"""Latency as ranks grow: labkv's dist_sync against MXNet 1.9.1 at the same W and S, in one run.

    python bench/ranks.py [--ranks=2,4,8] [--servers=1,2] [--cases=tiny,barrier]
        [--iters=500] [--repeats=3] [--mxnet=/path/to/mxnet-venv/bin/python] [--mxnet-cpu]

For each W: an embedded LocalCluster of W worker processes, W ranks
(``labkv.cluster.run``) on S servers, each iteration a push+pull of one float32
key ("tiny") or a barrier, as in ``bench/dist.py``. A run's time is the slowest
rank's seconds per iteration (each rank times ``--iters`` iterations after 2 warm
ones); the table gives the median over ``--repeats`` runs. Each rank also reports
the CPU of its worker process over those iterations (``time.process_time``: the
rank's thread, the servers on that worker and Dask's loop) and of its own thread
(``time.thread_time``); summed over the ranks and divided by the iterations, that
is the cluster's CPU per round, split into the ranks' threads and the rest.

``--mxnet=PYTHON`` runs MXNet 1.9.1's dist_sync (``bench/_mxnet.py``: ps-lite over
TCP on 127.0.0.1, W worker and S server processes) on the same cases, iterations
and repeats, right before and right after labkv's at each W (its time: rank 0's,
the median of the two runs), and prints labkv / MXNet. Both sides run on the same
cores at the same time of the run, so the ratio holds on a busy machine where the
milliseconds do not. ``--mxnet-cpu`` adds MXNet's CPU per round (all its processes,
``_mxnet.cpu_per_round``: two more clusters per W, S and case) beside labkv's.
A benchmark, not a test: it prints tables, it asserts nothing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def warmed_step(kv, case: str) -> Callable[[], None]:
    """One iteration of ``case`` on ``kv`` (its key initialised), after 2 warm
    ones and a barrier: a barrier, or a push+pull of one float32 ("tiny")."""
    if case == "barrier":
        step = kv.barrier
    else:
        kv.init(0, np.zeros(1, np.float32))
        grad, out = np.ones(1, np.float32), np.empty(1, np.float32)

        def step() -> None:
            kv.push(0, grad)
            kv.pull(0, out=out)

    for _ in range(2):
        step()
    kv.barrier()
    return step


def _rank(kv, case: str, iters: int) -> tuple[float, float, float]:
    """One rank's loop: (seconds per iteration, its process's CPU seconds and its
    thread's CPU seconds over the timed iterations)."""
    step = warmed_step(kv, case)
    cpu, thread = time.process_time(), time.thread_time()
    t = time.perf_counter()
    for _ in range(iters):
        step()
    elapsed = (time.perf_counter() - t) / iters
    cpu, thread = time.process_time() - cpu, time.thread_time() - thread
    kv.barrier()
    return elapsed, cpu, thread


def _labkv(handle, ranks: int, servers: int, case: str, iters: int) -> tuple[float, float, float]:
    """(slowest rank's seconds per iteration, CPU per round of all processes, of
    the ranks' threads)."""
    from labkv.cluster import run

    out = run(_rank, ranks, num_servers=servers, cluster=handle, args=(case, iters))
    return (
        max(t for t, _, _ in out),
        sum(c for _, c, _ in out) / iters,
        sum(th for _, _, th in out) / iters,
    )


def _mxnet(
    python: str, ranks: int, servers: list[int], cases: list[str], iters: int, repeats: int
) -> dict[int, dict[str, float]]:
    """MXNet's ms per iteration, ``{S: {case: ms}}``, on W = ``ranks`` workers."""
    from _mxnet import run_mxnet

    return {
        s: run_mxnet(python, s, ranks, cases, repeats=repeats, timeout_s=900, iters=iters)
        for s in servers
    }


def _mxnet_cpu(
    python: str, ranks: int, servers: list[int], cases: list[str], iters: int, repeats: int
) -> dict[int, dict[str, float]]:
    """MXNet's CPU ms per round (all its processes), ``{S: {case: ms}}``."""
    from _mxnet import cpu_per_round

    return {
        s: {c: cpu_per_round(python, s, ranks, c, iters, repeats, timeout_s=900) for c in cases}
        for s in servers
    }


def main(
    ranks: list[int],
    servers: list[int],
    cases: list[str],
    iters: int,
    repeats: int,
    mxnet_python: str | None,
    mxnet_cpu: bool = False,
) -> None:
    from labkv.cluster import connect

    rows, mx_cpu = [], {}
    for w in ranks:
        mx_runs = []
        if mxnet_python:
            mx_runs.append(_mxnet(mxnet_python, w, servers, cases, iters, repeats))
        with connect(n_workers=w, dashboard_address=None, set_as_default=False) as handle:
            for case in cases:
                for s in servers:
                    runs = [_labkv(handle, w, s, case, iters) for _ in range(repeats)]
                    rows.append(
                        (w, s, case, *(median(r[i] for r in runs) for i in range(3)), mx_runs)
                    )
        if mxnet_python:
            mx_runs.append(_mxnet(mxnet_python, w, servers, cases, iters, repeats))
            if mxnet_cpu:
                mx_cpu[w] = _mxnet_cpu(mxnet_python, w, servers, cases, iters, repeats)
    print(f"labkv dist_sync, W ranks on a W-worker embedded cluster, {iters} iterations, ms")
    print("(slowest rank, median of runs); CPU per round: all worker processes / ranks' threads")
    head = f"{'W':>3}{'S':>3} {'case':<8}{'labkv':>8}{'CPU':>8}{'ranks':>8}"
    print(
        head
        + (f"{'MXNet':>8}{'ratio':>7}" if mxnet_python else "")
        + (f"{'MX CPU':>8}" if mx_cpu else "")
    )
    for w, s, case, t, cpu, thread, mx_runs in rows:
        line = f"{w:>3}{s:>3} {case:<8}{t * 1e3:>8.3f}{cpu * 1e3:>8.3f}{thread * 1e3:>8.3f}"
        if mx_runs:
            m = median(run[s][case] for run in mx_runs)  # ms
            line += f"{m:>8.3f}{t * 1e3 / m:>7.2f}"
        if w in mx_cpu:
            line += f"{mx_cpu[w][s][case]:>8.3f}"
        print(line)
    if mxnet_python:
        print("MXNet: rank 0's ms per iteration, median of its run before and after labkv's")
    if mx_cpu:
        print("MX CPU: MXNet's CPU per round, all its processes (_mxnet.cpu_per_round)")


def _arguments(argv: list[str]) -> dict:
    known = {"ranks", "servers", "cases", "iters", "repeats", "mxnet"}
    options = {}
    mxnet_cpu = "--mxnet-cpu" in argv
    for arg in argv:
        if arg == "--mxnet-cpu":
            continue
        name, sep, value = arg.removeprefix("--").partition("=")
        if not sep or name not in known:
            raise SystemExit(f"bench/ranks.py: unknown argument {arg!r} (--help)")
        options[name] = value
    if mxnet_cpu and "mxnet" not in options:
        raise SystemExit("bench/ranks.py: --mxnet-cpu needs --mxnet=PYTHON")
    return {
        "ranks": [int(w) for w in options.get("ranks", "2,4,8").split(",")],
        "servers": [int(s) for s in options.get("servers", "1,2").split(",")],
        "cases": options.get("cases", "tiny,barrier").split(","),
        "iters": int(options.get("iters", 500)),
        "repeats": int(options.get("repeats", 3)),
        "mxnet_python": options.get("mxnet"),
        "mxnet_cpu": mxnet_cpu,
    }


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
    else:
        main(**_arguments(sys.argv[1:]))
