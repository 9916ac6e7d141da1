"""Minibatches per second and peak memory: MinibatchSource vs plain numpy.

Generates a ~1 GiB ``.npy`` dataset (read through memmaps) and a CTF text file
in a temporary directory, then runs every reader in a fresh subprocess (so
that each peak RSS is its own) for one epoch, with and without prefetch, and
with no work per step (``step -``) or with a stand-in training step
(``step mm``: ``x @ W``, W of 1024 columns, on one BLAS thread; it releases the
GIL, so prefetch can overlap reading with it). Ratios are
against plain numpy on the same data already in memory, measured in the same
run. The files are removed at the end.

    python bench/data.py            # ~1 GiB npy, ~25 MB CTF
    python bench/data.py --small    # a quick run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

DIM = 256
CTF_DIM, CTF_CLASSES = 64, 10
BATCH = 256


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    # VmHWM, not ru_maxrss: the latter keeps the parent's peak across fork + exec.
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def make_npy(d: str, rows: int) -> None:
    x = np.lib.format.open_memmap(f"{d}/x.npy", "w+", np.float32, (rows, DIM))
    rng = np.random.default_rng(0)
    for i in range(0, rows, 65536):
        x[i : i + 65536] = rng.random((min(65536, rows - i), DIM), dtype=np.float32)
    x.flush()
    del x
    np.save(f"{d}/y.npy", rng.integers(0, 10, rows))


def ctf_arrays(rows: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = np.round(rng.random((rows, CTF_DIM), dtype=np.float32), 3)
    return x, rng.integers(0, CTF_CLASSES, rows)


def make_ctf(d: str, rows: int) -> None:
    x, y = ctf_arrays(rows)
    with open(f"{d}/d.ctf", "w") as f:
        for i in range(rows):
            values = " ".join(f"{v:g}" for v in x[i].tolist())
            f.write(f"|features {values} |labels {y[i]}:1\n")


def child(args: argparse.Namespace) -> None:
    """Run one reader for one epoch; print minibatches/s and peak RSS growth."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from labkv.data import MinibatchSource

    base = rss_mib()
    w = np.random.default_rng(2).random((DIM if args.data == "npy" else CTF_DIM, 1024), np.float32)
    step = (lambda x: x @ w) if args.step else (lambda x: None)
    t_load = time.perf_counter()
    if args.reader.startswith("numpy"):
        if args.data == "npy":
            x, y = np.load(f"{args.dir}/x.npy"), np.load(f"{args.dir}/y.npy")
        else:
            x, y = ctf_arrays(args.rows)
        load = time.perf_counter() - t_load
        n = len(x)
        t0 = time.perf_counter()
        if args.reader == "numpy-slice":
            batches = ((x[i : i + BATCH], y[i : i + BATCH]) for i in range(0, n, BATCH))
        else:
            perm = np.random.default_rng(0).permutation(n)
            batches = ((x[perm[i : i + BATCH]], y[perm[i : i + BATCH]]) for i in range(0, n, BATCH))
        count = 0
        for count, (bx, _) in enumerate(batches, 1):  # noqa: B007
            step(bx)
    else:
        kw = dict(batch_size=BATCH, prefetch=args.prefetch, seed=0)
        if args.data == "npy":
            src = MinibatchSource.from_npy(
                {"x": f"{args.dir}/x.npy", "y": f"{args.dir}/y.npy"}, **kw
            )
        else:
            streams = {
                "x": {"field": "features", "dim": CTF_DIM},
                "y": {"field": "labels", "dim": CTF_CLASSES, "sparse": True},
            }
            src = MinibatchSource.from_ctf(f"{args.dir}/d.ctf", streams, **kw)
        load = time.perf_counter() - t_load
        t0 = time.perf_counter()
        count = 0
        for mb in src:
            step(mb["x"])
            count += 1
        src.close()
    seconds = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "batches": count,
                "seconds": seconds,
                "open_s": load,
                "peak_mib": peak_rss_mib() - base,
            }
        )
    )


def run(d: str, data: str, reader: str, prefetch: int, step: bool, rows: int) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--dir",
        d,
        "--data",
        data,
        "--reader",
        reader,
        "--prefetch",
        str(prefetch),
        "--rows",
        str(rows),
    ] + (["--step"] if step else [])
    # One BLAS thread: a multi-threaded BLAS spinning on 2 cores distorts every row.
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="64 MiB npy, small CTF: a quick run")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--reader", help=argparse.SUPPRESS)
    ap.add_argument("--prefetch", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--rows", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--step", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    npy_rows = (64 << 20) // (DIM * 4) if args.small else (1 << 30) // (DIM * 4)
    ctf_rows = 5_000 if args.small else 60_000
    d = tempfile.mkdtemp(prefix="labkv-bench-data-")
    try:
        t = time.perf_counter()
        make_npy(d, npy_rows)
        make_ctf(d, ctf_rows)
        sizes = {
            k: os.path.getsize(f"{d}/{f}") / 2**20 for k, f in (("npy", "x.npy"), ("ctf", "d.ctf"))
        }
        print(
            f"generated in {time.perf_counter() - t:.1f}s: npy {sizes['npy']:.0f} MiB "
            f"({npy_rows} x {DIM} float32), CTF {sizes['ctf']:.0f} MiB "
            f"({ctf_rows} x {CTF_DIM} dense + sparse labels); batch {BATCH}; page cache warm"
        )
        plans = {
            "npy": [
                ("numpy-slice", 0),
                ("numpy-take", 0),
                ("MinibatchSource", 0),
                ("MinibatchSource", 2),
            ],
            "ctf": [("numpy-take", 0), ("MinibatchSource", 0), ("MinibatchSource", 2)],
        }
        header = (
            f"{'data':4} {'step':5} {'reader':28} {'mb/s':>9} {'vs numpy-take':>13} "
            f"{'open s':>7} {'peak RSS +MiB':>13}"
        )
        print(header)
        print("-" * len(header))
        for data, plan in plans.items():
            rows = npy_rows if data == "npy" else ctf_rows
            for step in (False, True):
                results = [(r, p, run(d, data, r, p, step, rows)) for r, p in plan]
                ref = next(res for r, _, res in results if r == "numpy-take")
                ref_rate = ref["batches"] / ref["seconds"]
                for reader, prefetch, res in results:
                    rate = res["batches"] / res["seconds"]
                    name = reader + (
                        f" prefetch={prefetch}" if reader == "MinibatchSource" else " (in memory)"
                    )
                    print(
                        f"{data:4} {'mm' if step else '-':5} {name:28} {rate:9.0f} "
                        f"{rate / ref_rate:13.3g} {res['open_s']:7.2f} {res['peak_mib']:13.0f}"
                    )
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
