"""MXNet 1.9.1's distributed KVStore on the cases of ``bench/dist.py``, for comparison.

    python bench/_mxnet.py --python /tmp/mxvenv/bin/python [--servers 1] [--full]
        [--cases "16MiB x1,tiny"] [--repeats 3]

MXNet (its ``dist_sync`` store: ps-lite over ZeroMQ/TCP on 127.0.0.1) needs its own
Python (``pip install 'numpy<1.24' mxnet==1.9.1`` in a separate venv), so this file
imports no MXNet itself: ``run_mxnet`` starts one process of that Python per role, each
running this same file with ``--role``. ps-lite reads its cluster from the environment:
``DMLC_ROLE`` (scheduler, server or worker), ``DMLC_PS_ROOT_URI=127.0.0.1`` and
``DMLC_PS_ROOT_PORT`` (a free port) for the scheduler every other node registers with,
``DMLC_NUM_SERVER`` and ``DMLC_NUM_WORKER``. The scheduler and the servers only
``import mxnet``: with ``DMLC_ROLE`` not ``worker`` that import runs the server loop and
exits the process when the workers finish. Each worker creates ``mx.kv.create
("dist_sync")`` and, per iteration, pushes its gradients and pulls the model
(``kv.push(keys, grads); kv.pull(keys, out=outs); mx.nd.waitall()``), or calls
``kv._barrier()`` in the barrier case. The cases, iteration counts (``quick`` as
``dist.py --quick``: a quarter, at least 5), the 2 warm-up iterations and the repeats are
those of ``dist.py``; the result is rank 0's seconds per iteration, median over the
repeats, in ms. All repeats of a case run in one cluster, a fresh cluster per S; the
2-bit case gets a cluster of its own, since MXNet's compression, once set, applies to
every key of the store.

``cpu_per_round`` gives the CPU all of MXNet's processes (scheduler, servers and
workers: each one's threads) spend per iteration of one case: two clusters, of ``iters``
and of five times ``iters`` iterations a repeat, each process's CPU read from the
kernel when the launcher reaps it (``getrusage(RUSAGE_CHILDREN)``); the difference,
divided by the extra iterations, leaves out the start, the warm-up and the exit.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import resource
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from statistics import median

MIB = 1 << 20

#: (case, float32 values per key, iterations in full mode), as in ``bench/dist.py``
CASES: list[tuple[str, list[int], int]] = [
    ("16MiB x1", [4 * MIB] * 1, 30),
    ("16MiB 2bit", [4 * MIB] * 1, 30),
    ("4MiB x4", [MIB] * 4, 30),
    ("1KiB x200", [256] * 200, 200),
    ("tiny", [1], 500),
    ("barrier", [], 500),
]
_SIZES = {case: sizes for case, sizes, _ in CASES}
_ITERS = {case: iters for case, _, iters in CASES}
_MARK = "MXNET_BENCH_RESULT "
_INSTALL = "pip install 'numpy<1.24' mxnet==1.9.1  (in a separate venv; it needs numpy < 1.24)"


def _iters(case: str, quick: bool) -> int:
    return max(5, _ITERS[case] // 4) if quick else _ITERS[case]


# --- the worker role (runs under MXNet's Python) -------------------------------------


def _worker(cases: list[str], quick: bool, repeats: int, iters: int | None = None) -> None:
    import mxnet as mx

    kv = mx.kv.create("dist_sync")
    if any(case.endswith("2bit") for case in cases):
        # Before any init: it applies to every key of this store from then on.
        kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    result: dict[str, list[float]] = {}
    first_key = 0
    for case in cases:
        n = iters or _iters(case, quick)
        if case == "barrier":
            times = []
            for _ in range(repeats):
                kv._barrier()
                t = time.perf_counter()
                for _ in range(n):
                    kv._barrier()
                times.append((time.perf_counter() - t) / n)
            result[case] = times
            continue
        sizes = _SIZES[case]
        keys = list(range(first_key, first_key + len(sizes)))
        first_key += len(sizes)
        kv.init(keys, [mx.nd.zeros(n, dtype="float32") for n in sizes])
        grads = [mx.nd.ones(n, dtype="float32") for n in sizes]
        outs = [mx.nd.empty(n, dtype="float32") for n in sizes]
        kv.push(keys, grads)
        kv.pull(keys, out=outs)
        # Without an optimizer the first pull is the sum of the workers' pushes, 2-bit
        # ones quantized to the threshold (later pulls are not: MXNet's servers then
        # double what they store, up to inf).
        got = float(outs[-1][-1:].asnumpy()[0])
        want = kv.num_workers * (0.5 if case.endswith("2bit") else 1.0)
        if got != want:
            raise AssertionError(f"{case}: pulled {got}, expected {want}")
        times = []
        for _ in range(repeats):
            for _ in range(2):  # warm up
                kv.push(keys, grads)
                kv.pull(keys, out=outs)
                mx.nd.waitall()
            kv._barrier()
            t = time.perf_counter()
            for _ in range(n):
                kv.push(keys, grads)
                kv.pull(keys, out=outs)
                mx.nd.waitall()
            times.append((time.perf_counter() - t) / n)
            kv._barrier()
        result[case] = times
    print(_MARK + json.dumps({"rank": kv.rank, "seconds": result}), flush=True)


# --- the launcher (runs under any Python, no MXNet) ----------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the launcher dies, even by SIGKILL."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _environ(port: int, servers: int, workers: int) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DMLC_", "PS_", "MXNET_", "OMP_", "PYTHON"))
    }
    env.update(
        DMLC_PS_ROOT_URI="127.0.0.1",
        DMLC_PS_ROOT_PORT=str(port),
        DMLC_NODE_HOST="127.0.0.1",
        DMLC_INTERFACE="lo",
        DMLC_NUM_SERVER=str(servers),
        DMLC_NUM_WORKER=str(workers),
        # 5 processes on a small machine: one compute thread each.
        OMP_NUM_THREADS="1",
        MXNET_CPU_WORKER_NTHREADS="1",
        MXNET_OMP_MAX_THREADS="1",
        MXNET_KVSTORE_REDUCTION_NTHREADS="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def _check_mxnet(python: str) -> None:
    try:
        proc = subprocess.run(
            [python, "-c", "import mxnet; print(mxnet.__version__)"],
            capture_output=True,
            text=True,
            timeout=120,
            env={k: v for k, v in os.environ.items() if not k.startswith("DMLC_")},
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"cannot run {python!r} to import mxnet ({e}); {_INSTALL}") from e
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["?"]
        raise RuntimeError(f"{python!r} cannot import mxnet ({tail[0]}); {_INSTALL}")


def _tail(path: Path, lines: int = 15) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def _cluster(
    python: str,
    servers: int,
    workers: int,
    cases: list[str],
    quick: bool,
    repeats: int,
    deadline: float,
    iters: int | None = None,
) -> dict[str, list[float]]:
    """One ps-lite cluster running ``cases``; rank 0's seconds per iteration, per repeat."""
    env = _environ(_free_port(), servers, workers)
    me = str(Path(__file__).resolve())
    worker_args = ["--cases", json.dumps(cases), "--repeats", str(repeats)]
    worker_args += ["--quick"] if quick else []
    worker_args += ["--iters", str(iters)] if iters else []
    roles = ["scheduler"] + ["server"] * servers + ["worker"] * workers
    procs: list[tuple[str, subprocess.Popen, Path]] = []
    with tempfile.TemporaryDirectory(prefix="mxnet-bench-") as tmp:
        try:
            for i, role in enumerate(roles):
                log = Path(tmp, f"{i}-{role}.log")
                args = [python, me, "--role", role] + (worker_args if role == "worker" else [])
                with open(log, "wb") as f:  # files, not pipes: nothing to drain
                    proc = subprocess.Popen(
                        args,
                        env=dict(env, DMLC_ROLE=role),
                        stdin=subprocess.DEVNULL,
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # its own process group, killed as one
                        preexec_fn=_die_with_parent,
                    )
                procs.append((role, proc, log))
            # The scheduler and the servers exit once the workers have finalized.
            while any(p.poll() is None for _, p, _ in procs):
                for role, p, log in procs:
                    if p.returncode not in (None, 0):
                        raise RuntimeError(
                            f"MXNet {role} exited with {p.returncode}:\n{_tail(log)}"
                        )
                if time.monotonic() > deadline:
                    raise TimeoutError(f"MXNet cluster (S={servers}, {cases}) timed out")
                time.sleep(0.05)
            for role, p, log in procs:
                if p.returncode != 0:
                    raise RuntimeError(f"MXNet {role} exited with {p.returncode}:\n{_tail(log)}")
            for role, _, log in procs:
                if role != "worker":
                    continue
                for line in log.read_text(errors="replace").splitlines():
                    if line.startswith(_MARK):
                        out = json.loads(line[len(_MARK) :])
                        if out["rank"] == 0:
                            return out["seconds"]
            raise RuntimeError("no MXNet worker reported rank 0's result")
        finally:
            for _, p, _ in procs:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(p.pid, signal.SIGKILL)
            for _, p, _ in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=10)


def run_mxnet(
    python: str,
    servers: int,
    workers: int = 2,
    cases: list[str] | None = None,
    quick: bool = True,
    timeout_s: float = 300,
    repeats: int = 3,
    iters: int | None = None,
) -> dict[str, float]:
    """MXNet's dist_sync on ``cases`` (all of ``CASES`` by default) with ``servers``
    servers and ``workers`` workers: ``{case: rank 0's ms per iteration, median over
    repeats}``, in ``CASES`` order (``iters`` iterations a repeat, if given, instead of
    the case's own count). ``python`` must import mxnet; every process started
    is killed on any error or after ``timeout_s`` seconds (all clusters together)."""
    names = [case for case, _, _ in CASES]
    cases = names if cases is None else cases
    unknown = [case for case in cases if case not in names]
    if unknown:
        raise ValueError(f"unknown cases {unknown}; known: {names}")
    deadline = time.monotonic() + timeout_s
    _check_mxnet(python)
    groups = [
        [c for c in cases if not c.endswith("2bit")],
        [c for c in cases if c.endswith("2bit")],
    ]
    seconds: dict[str, list[float]] = {}
    for group in groups:
        if group:
            seconds.update(
                _cluster(python, servers, workers, group, quick, repeats, deadline, iters)
            )
    return {case: median(seconds[case]) * 1e3 for case in names if case in cases}


def _children_cpu() -> float:
    """CPU seconds of every child process this process has reaped so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_per_round(
    python: str,
    servers: int,
    workers: int,
    case: str,
    iters: int,
    repeats: int = 3,
    timeout_s: float = 300,
) -> float:
    """CPU ms of all MXNet processes per iteration of ``case`` (see module doc)."""
    if case.endswith("2bit"):
        raise ValueError("cpu_per_round measures the uncompressed cases")
    deadline = time.monotonic() + timeout_s
    _check_mxnet(python)
    spent = []
    for n in (iters, 5 * iters):
        before = _children_cpu()
        _cluster(python, servers, workers, [case], True, repeats, deadline, n)
        spent.append(_children_cpu() - before)
    return (spent[1] - spent[0]) / (4 * iters * repeats) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=["scheduler", "server", "worker"])
    parser.add_argument("--python", help="a Python that imports mxnet 1.9.1")
    parser.add_argument("--servers", type=int, choices=[1, 2], help="only this S")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cases", help='JSON list or "a,b"; all by default')
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="(the default of the table)")
    parser.add_argument("--full", action="store_true", help="dist.py's full iteration counts")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--iters", type=int, help="iterations a repeat, for every case")
    args = parser.parse_args()
    cases = None
    if args.cases:
        cases = json.loads(args.cases) if args.cases.startswith("[") else args.cases.split(",")
    if args.role == "worker":
        _worker(cases or [c for c, _, _ in CASES], args.quick, args.repeats, args.iters)
        return
    if args.role:  # scheduler or server: the import runs it, then exits the process
        import mxnet  # noqa: F401

        return
    if not args.python:
        parser.error("--python is required (a Python that imports mxnet)")
    t = time.perf_counter()
    quick = not args.full
    results = {
        s: run_mxnet(
            args.python, s, args.workers, cases, quick, args.timeout, args.repeats, args.iters
        )
        for s in ([args.servers] if args.servers else [1, 2])
    }
    mode = "quick" if quick else "full"
    print(
        f"MXNet 1.9.1 dist_sync, W = {args.workers} workers, push+pull per iteration "
        f"(ms, rank 0, median of {args.repeats} runs, {mode} iteration counts)"
    )
    print(f"{'case':<12}" + "".join(f"{f'S={s} ms':>10}" for s in results))
    for case in next(iter(results.values())):
        print(f"{case:<12}" + "".join(f"{r[case]:>10.2f}" for r in results.values()))
    print(f"({time.perf_counter() - t:.1f} s)")


if __name__ == "__main__":
    main()
