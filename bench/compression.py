"""Micro benchmark of the gradient compression codec (``labkv.compression``).

    python bench/compression.py [--size=4194304] [--repeats=15] [--naive]

Times, on one numpy array of ``--size`` float32 values (default 4 Mi values,
16 MiB, the model of ``bench/dist.py``), each step of a compressed push:
``quantize`` (residual + gradient, quantised, residual updated), ``pack``
(the wire codes), ``encode`` (both at once, what a dist store's push does),
``compress`` (quantize through a store's ``compress`` and
``commit``, residual arrays reused), ``unpack`` (codes back to float32), and a
plain copy of the array as the memory's yardstick. Each line gives the best
and the median of ``--repeats`` runs, in ms and in GB/s of float32 values
(``4 * size`` bytes over the time). ``--naive`` also times the plain
``np.where`` formulation the codec replaced (its numbers are the "before").
The link bandwidth above which compression stops paying is in docs/performance.md.
A benchmark, not a test: it prints a table, it asserts nothing.
"""

from __future__ import annotations

import sys
import time
from statistics import median

import numpy as np

from labkv.compression import (
    GradientCompression,
    pack_1bit,
    pack_2bit,
    unpack_1bit,
    unpack_2bit,
)


def _naive_quantize_2bit(grad, residual, t):
    r = residual + grad
    sent = np.where(r >= t, t, np.where(r <= -t, -t, np.float32(0))).astype(np.float32)
    return sent, r - sent


def _naive_pack_2bit(sent, t):
    codes = np.where(sent == t, np.uint8(3), np.where(sent == -t, np.uint8(2), np.uint8(0)))
    codes = np.concatenate([codes, np.zeros(-codes.size % 4, np.uint8)]).reshape(-1, 4)
    return (codes[:, 0] << 6) | (codes[:, 1] << 4) | (codes[:, 2] << 2) | codes[:, 3]


def _naive_unpack_2bit(packed, t, size):
    codes = np.stack([(packed >> s) & 3 for s in (6, 4, 2, 0)], axis=1).reshape(-1)[:size]
    return np.where(codes == 3, t, np.where(codes == 2, -t, np.float32(0))).astype(np.float32)


def _time(fn, repeats: int) -> tuple[float, float]:
    fn()  # warm up (first touch of new arrays, lookup tables)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), median(times)


def main(size: int = 4 << 20, repeats: int = 15, naive: bool = False) -> None:
    rng = np.random.default_rng(0)
    grad = rng.normal(0, 0.6, size).astype(np.float32)
    residual = rng.normal(0, 0.3, size).astype(np.float32)
    scratch = np.empty(size, np.float32)
    t = np.float32(0.5)
    cases = []
    for kind, threshold in (("2bit", 0.5), ("1bit", 0.0)):
        gc = GradientCompression(kind, threshold)
        sent, _ = gc.quantize(grad, residual)
        if kind == "2bit":
            packed = pack_2bit(sent, threshold)
            pack = lambda s=sent: pack_2bit(s, 0.5)  # noqa: E731
            unpack = lambda p=packed: unpack_2bit(p, 0.5, size)  # noqa: E731
        else:
            packed = pack_1bit(sent)
            pack = lambda s=sent: pack_1bit(s)  # noqa: E731
            unpack = lambda p=packed: unpack_1bit(p, size)  # noqa: E731
        store = GradientCompression(kind, threshold)

        def push(store=store):
            _, commit = store.compress([("w", [grad])])
            store.release(commit())  # as a local store does: the old residual is reused

        cases += [
            (f"{kind} quantize (new residual)", lambda gc=gc: gc.quantize(grad, residual)),
            (
                f"{kind} quantize (into scratch)",
                lambda gc=gc: gc.quantize(grad, residual, out=scratch),
            ),
            (
                f"{kind} encode (quantize + pack)",
                lambda gc=gc: gc.encode(grad, residual, out=scratch),
            ),
            (f"{kind} compress + commit", push),
            (f"{kind} pack", pack),
            (f"{kind} unpack", unpack),
        ]
        if kind == "2bit" and naive:
            cases += [
                (
                    "2bit quantize, np.where (before)",
                    lambda: _naive_quantize_2bit(grad, residual, t),
                ),
                ("2bit pack, np.where (before)", lambda s=sent: _naive_pack_2bit(s, t)),
                ("2bit unpack, np.where (before)", lambda p=packed: _naive_unpack_2bit(p, t, size)),
            ]
    cases.append(("copy (memory yardstick)", lambda: np.copyto(scratch, grad)))
    nbytes = 4 * size
    print(f"{size} float32 values ({nbytes / 2**20:.1f} MiB), best / median of {repeats} runs")
    print(f"{'step':34s} {'best ms':>8s} {'med ms':>8s} {'best GB/s':>10s} {'med GB/s':>9s}")
    for name, fn in cases:
        best, med = _time(fn, repeats)
        print(
            f"{name:34s} {best * 1e3:8.2f} {med * 1e3:8.2f} "
            f"{nbytes / best / 1e9:10.2f} {nbytes / med / 1e9:9.2f}"
        )


if __name__ == "__main__":
    options = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    main(
        size=int(options.get("size", 4 << 20)),
        repeats=int(options.get("repeats", 15)),
        naive="--naive" in sys.argv,
    )
