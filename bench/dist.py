"""Benchmark of the dist_sync store against a raw Dask echo and MXNet, measured in one run.

    python bench/dist.py [--quick] [--dask-malloc] [--only=16MiB x1,tiny] [--repeats=3]
        [--mxnet=/path/to/mxnet-venv/bin/python] [--field]
    python bench/dist.py --ranks=2,4,8 [--repeats=3] [--mxnet=...]

W = 2 ranks (``labkv.cluster.run``) on an embedded 2-worker LocalCluster, with
S = 1 and S = 2 servers, each also with ``replicas=2`` (every server's backup on
the other worker): push+pull per iteration of a 16 MiB model (1 key; 1
key whose pushes travel 2-bit compressed; 4 keys of 4 MiB), 200 keys x 1 KiB,
one tiny key, and a barrier. The baseline is
a task on one worker echoing the same bytes through one call to the other
worker: to an async actor method (what labkv's servers are), and to a plain
worker comm handler (the "worker extension" alternative), and on labkv's own
stream (one Dask comm to the worker's listener, its own frames on it). The echo runs on the
store's own cluster (whose workers reuse big buffers, see
``labkv.cluster._runtime.connect._MALLOC_ENV``) and once more on a cluster with Dask's
default worker environment (every buffer over 128 KiB a fresh mmap), the
baseline as Dask ships. Each rank also counts its worker process's page faults
(``ru_minflt``) per iteration: the rank and its worker's server share the
process. ``--dask-malloc`` runs the store itself on Dask's default worker
environment too (what it measured before the embedded workers reused buffers).

``--mxnet=PYTHON`` also runs MXNet 1.9.1's dist_sync store (ps-lite over TCP on
127.0.0.1, ``bench/_mxnet.py``) on the same cases with that Python, once before
and once after labkv's, and prints labkv / MXNet. ``--field`` adds what a user
in the field meets: the notebook's own store (rank 0 of 1) on a tiny key, the
barrier with 2, 4 and 8 ranks (an 8-worker cluster on however many cores), and
the tiny and 16 MiB cases on a ``tls://`` cluster with its own certificates
against ``tcp://`` (made with the ``openssl`` command), alternated.
The streams' frames once went through tornado's ``IOStream``; that comparison is
in docs/performance.md.
``--ranks=2,4,8`` measures latency as ranks grow instead: the tiny and barrier cases
with W ranks on a W-worker cluster, S = 1 and 2, against MXNet at the same W and S
(``bench/ranks.py``, which has the details).
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
from typing import Any

import numpy as np

MIB = 1 << 20


class Echo:
    """The baseline's actor: returns what it gets."""

    async def echo(self, data):
        return data

    peek = echo  # a server method's name: what a labkv stream may call


def _install_stream(dask_worker):
    from labkv.cluster._transport import stream

    stream.install(dask_worker)


def _stream_echo(address, actor_key, nbytes, iters):
    """The same echo on labkv's stream (``labkv.cluster._transport.stream``), from
    the task's thread as a rank calls (written from the thread once the stream is open)."""
    import concurrent.futures

    from distributed import get_worker

    from labkv.cluster._transport import stream

    worker = get_worker()
    loop = worker.loop.asyncio_loop
    data = np.ones(nbytes // 4, dtype=np.float32)

    def once():
        future = concurrent.futures.Future()
        stream.send(loop, worker.connection_args, address, actor_key, "peek", [data], future)
        return future.result()

    once()
    t = time.perf_counter()
    for _ in range(iters):
        once()
    return (time.perf_counter() - t) / iters


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


#: the cases and their iterations (a quarter with --quick)
_CASES = {
    "16MiB x1": 30,
    "16MiB 2bit": 30,
    "4MiB x4": 30,
    "1KiB x200": 200,
    "tiny": 500,
    "barrier": 500,
}

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


def _notebook_tiny(kv, iters: int) -> float:
    """The notebook's own store: seconds per tiny push+pull."""
    key = f"nb-{time.perf_counter_ns()}"
    kv.init(key, np.zeros(1, np.float32))
    grad, out = np.ones(1, np.float32), np.empty(1, np.float32)
    for _ in range(20):
        kv.push(key, grad)
        kv.pull(key, out=out)
    t = time.perf_counter()
    for _ in range(iters):
        kv.push(key, grad)
        kv.pull(key, out=out)
    return (time.perf_counter() - t) / iters


def _notebook_cases(handle, iters: int, repeats: int) -> dict[int, float]:
    import labkv

    times: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(repeats):
        for servers in (1, 2):
            with labkv.create("dist_sync", cluster=handle, num_servers=servers) as kv:
                times[servers].append(_notebook_tiny(kv, iters))
    return {s: median(ts) for s, ts in times.items()}


def _barrier_scaling(ranks: tuple[int, ...], iters: int, repeats: int) -> dict[int, float]:
    """Seconds per barrier with each number of ranks, S = 1, on one cluster of
    ``max(ranks)`` workers."""
    from labkv.cluster import connect, run

    out = {}
    with connect(n_workers=max(ranks), dashboard_address=None, set_as_default=False) as handle:
        for w in ranks:
            per_run = [
                max(
                    t
                    for t, _, _ in run(
                        _ranks,
                        num_workers=w,
                        num_servers=1,
                        cluster=handle,
                        args=("barrier", iters),
                    )
                )
                for _ in range(repeats)
            ]
            out[w] = median(per_run)
    return out


def _certificates(folder: str) -> Any:
    """A CA and one node certificate for 127.0.0.1, made with ``openssl``; the
    ``Security`` that requires them."""
    import subprocess

    from distributed import Security

    def sh(cmd: str) -> None:
        subprocess.run(cmd, shell=True, cwd=folder, check=True, capture_output=True)

    sh(
        'openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 1 -subj "/CN=ca"'
    )
    sh('openssl req -newkey rsa:2048 -nodes -keyout node.key -out node.csr -subj "/CN=node"')
    with open(os.path.join(folder, "ext.cnf"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
    sh(
        "openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
        "-out node.pem -days 1 -extfile ext.cnf"
    )
    ca, cert, key = (os.path.join(folder, n) for n in ("ca.pem", "node.pem", "node.key"))
    return Security(
        tls_ca_file=ca,
        tls_client_cert=cert,
        tls_client_key=key,
        tls_scheduler_cert=cert,
        tls_scheduler_key=key,
        tls_worker_cert=cert,
        tls_worker_key=key,
        require_encryption=True,
    )


def _tls_against_tcp(iters: dict[str, int], repeats: int) -> dict[str, dict[str, float]]:
    """tiny and 16 MiB x1 (W = 2, S = 1) on a tcp:// and a tls:// cluster, alternated."""
    import tempfile

    from labkv.cluster import connect, run

    times: dict[str, dict[str, list[float]]] = {"tcp": {}, "tls": {}}
    with tempfile.TemporaryDirectory() as folder:
        security = _certificates(folder)
        with (
            connect(n_workers=2, dashboard_address=None, set_as_default=False) as tcp,
            connect(
                n_workers=2,
                dashboard_address=None,
                set_as_default=False,
                security=security,
                protocol="tls",
            ) as tls,
        ):
            for _ in range(repeats):
                for name, handle in (("tcp", tcp), ("tls", tls)):
                    for case, n in iters.items():
                        per_rank = run(
                            _ranks, num_workers=2, num_servers=1, cluster=handle, args=(case, n)
                        )
                        times[name].setdefault(case, []).append(max(t for t, _, _ in per_rank))
    return {name: {c: median(ts) for c, ts in cases.items()} for name, cases in times.items()}


def _mxnet_runs(python: str, cases: list[str], quick: bool, repeats: int) -> dict[int, dict]:
    from _mxnet import run_mxnet

    return {s: run_mxnet(python, s, cases=cases, quick=quick, repeats=repeats) for s in (1, 2)}


def _print_against_mxnet(rows, mxnet: list[dict[int, dict]], notebook, barriers, mx_barriers):
    print()
    print("labkv against MXNet 1.9.1 dist_sync (ps-lite, TCP on 127.0.0.1), W = 2, ms;")
    print("MXNet: median of its run before and its run after labkv's")
    print(
        f"{'case':<14}{'MXNet S=1':>10}{'S=2':>8}{'labkv S=1':>11}{'S=2':>8}"
        f"{'ratio S=1':>11}{'S=2':>7}"
    )

    def mx(case: str, servers: int) -> float:
        return median(run[servers][case] for run in mxnet) / 1e3

    for case, t1, t2, *_ in rows:
        m1, m2 = mx(case, 1), mx(case, 2)
        print(
            f"{case:<14}{m1 * 1e3:>10.2f}{m2 * 1e3:>8.2f}{t1 * 1e3:>11.2f}{t2 * 1e3:>8.2f}"
            f"{t1 / m1:>11.2f}{t2 / m2:>7.2f}"
        )
    if notebook and any("tiny" in run[1] for run in mxnet):
        m1, m2 = mx("tiny", 1), mx("tiny", 2)
        t1, t2 = notebook[1], notebook[2]
        print(
            f"{'tiny notebook':<14}{m1 * 1e3:>10.2f}{m2 * 1e3:>8.2f}{t1 * 1e3:>11.2f}"
            f"{t2 * 1e3:>8.2f}{t1 / m1:>11.2f}{t2 / m2:>7.2f}"
        )
    if barriers and mx_barriers:
        print()
        print("barrier by ranks (S = 1, ms): labkv, MXNet, ratio")
        for w, t in barriers.items():
            m = mx_barriers.get(w)
            cell = f"{m:8.3f}{t / (m / 1e3):8.2f}" if m else ""
            print(f"  W = {w}: {t * 1e3:8.3f}{cell}")


def main(
    quick: bool = False,
    dask_malloc: bool = False,
    repeats: int = 3,
    only: list[str] | None = None,
    mxnet_python: str | None = None,
    field: bool = False,
) -> None:
    from labkv.cluster import run

    names = [c for c in _CASES if not only or c in only]
    mxnet = []
    if mxnet_python:
        mxnet.append(_mxnet_runs(mxnet_python, names, quick, 1))

    scale = 4 if quick else 1
    dask_default = _default_environ_echo(scale)
    with _cluster(dask_malloc) as handle:
        client = handle.client
        a, b = handle.workers()
        actor = client.submit(Echo, actor=True, workers=[b], pure=False).result()
        client.run(_install_handler, workers=[b])
        client.run(_install_stream, workers=[b])
        base = {}
        for label, nbytes, iters in ECHOES:
            base[("actor", label)] = _best_of_3(
                client, a, _actor_echo, actor, nbytes, iters // scale
            )
            base[("handler", label)] = _best_of_3(
                client, a, _handler_echo, b, nbytes, iters // scale
            )
            base[("stream", label)] = _best_of_3(
                client, a, _stream_echo, b, actor.key, nbytes, iters // scale
            )
        cases = [(case, _CASES[case]) for case in names]
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
                args = (case, max(5, iters // scale))
                for servers in (1, 2):
                    per_rank = run(_ranks, 2, num_servers=servers, cluster=handle, args=args)
                    t = max(t for t, _, _ in per_rank)
                    times[servers].append(t)
                    ratios[servers].append(t / echo)
                    loads[servers] = per_rank[0][1]
                    if per_rank[0][2] is not None:
                        faults[servers].append(max(f for _, _, f in per_rank))
                    # The same with every server replicated on the other worker.
                    per_rank = run(
                        _ranks, 2, num_servers=servers, replicas=2, cluster=handle, args=args
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
        notebook = _notebook_cases(handle, 500 // scale, repeats) if field else None
    barriers = _barrier_scaling((2, 4, 8), 500 // scale, repeats) if field else None
    tls = (
        _tls_against_tcp({"tiny": 500 // scale, "16MiB x1": 30 // scale}, repeats)
        if field
        else None
    )
    mx_barriers = {}
    if mxnet_python:
        from _mxnet import run_mxnet

        mxnet.append(_mxnet_runs(mxnet_python, names, quick, 1))
        if field:
            for w in (4, 8):
                mx_barriers[w] = run_mxnet(mxnet_python, 1, w, ["barrier"], quick)["barrier"]
            mx_barriers[2] = (
                median(run[1]["barrier"] for run in mxnet) if "barrier" in names else None
            )
    echo16, echo_tiny = base[("actor", "16MiB")], base[("actor", "tiny")]
    print()
    print("raw Dask echo, task on worker A -> worker B -> back (ms per call, best of 3):")
    print(f"  async actor method : 16 MiB {echo16 * 1e3:7.2f}   tiny {echo_tiny * 1e3:6.3f}")
    print(
        f"  worker comm handler: 16 MiB {base[('handler', '16MiB')] * 1e3:7.2f}   "
        f"tiny {base[('handler', 'tiny')] * 1e3:6.3f}"
    )
    print(
        f"  labkv's stream     : 16 MiB {base[('stream', '16MiB')] * 1e3:7.2f}   "
        f"tiny {base[('stream', 'tiny')] * 1e3:6.3f}"
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
    if notebook:
        print()
        print(
            f"the notebook's own store, tiny push+pull (ms): S=1 {notebook[1] * 1e3:.3f}"
            f"   S=2 {notebook[2] * 1e3:.3f}"
        )
    if barriers:
        print(
            "barrier by ranks, S = 1 (ms): "
            + "  ".join(f"W={w} {t * 1e3:.3f}" for w, t in barriers.items())
        )
    if tls:
        print("tls:// with certificates against tcp:// (W = 2, S = 1, ms):")
        for case in tls["tcp"]:
            a, b = tls["tcp"][case], tls["tls"][case]
            print(f"  {case:<10} tcp {a * 1e3:8.3f}   tls {b * 1e3:8.3f}   tls/tcp {b / a:5.2f}")
    if mxnet:
        _print_against_mxnet(rows, mxnet, notebook, barriers, mx_barriers)


_FLAGS = ("--quick", "--dask-malloc", "--field")
_OPTIONS = ("only", "repeats", "mxnet", "ranks")


def _arguments(argv: list[str]) -> dict[str, Any]:
    """``main``'s keyword arguments from the command line; an argument it does not
    know stops the run (a misspelt or dropped flag would otherwise run the whole
    benchmark without it)."""
    options, flags = {}, set()
    for arg in argv:
        name, sep, value = arg.removeprefix("--").partition("=")
        if sep and name in _OPTIONS:
            options[name] = value
        elif not sep and arg in _FLAGS:
            flags.add(arg)
        else:
            known = ", ".join([*_FLAGS, *(f"--{o}=" for o in _OPTIONS)])
            raise SystemExit(f"bench/dist.py: unknown argument {arg!r} (known: {known}; --help)")
    return {
        "quick": "--quick" in flags,
        "dask_malloc": "--dask-malloc" in flags,
        "field": "--field" in flags,
        "repeats": int(options.get("repeats", 3)),
        "only": options["only"].split(",") if "only" in options else None,
        "mxnet_python": options.get("mxnet"),
        "ranks": [int(w) for w in options["ranks"].split(",")] if "ranks" in options else None,
    }


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
    else:
        arguments = _arguments(sys.argv[1:])
        ranks = arguments.pop("ranks")
        if ranks:
            import ranks as by_ranks

            by_ranks.main(
                ranks,
                [1, 2],
                ["tiny", "barrier"],
                125 if arguments["quick"] else 500,
                arguments["repeats"],
                arguments["mxnet_python"],
            )
        else:
            main(**arguments)
