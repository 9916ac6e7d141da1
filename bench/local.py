"""Benchmark of the local store against the machine's own bound, measured side by side.

For 4 devices and float32 values of 4 KiB .. 64 MiB: one push of the 4
per-device values plus one pull into 4 outputs, against the numpy bound
(the sum of 4 arrays into one, then 4 copies) timed in the same run,
interleaved, best of several repeats. Then tiny one-key push+pull calls, and
one push+pull of 100 tiny keys x 4 devices. With ``--gpu`` the values are
CuPy arrays on the ``device`` store and the bound is CuPy's own sum and copies.

Run: ``python3 bench/local.py`` (``--quick`` for a short run, ``--gpu`` on a GPU machine).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

import labkv

SIZES = {"4 KiB": 4 << 10, "1 MiB": 1 << 20, "16 MiB": 16 << 20, "64 MiB": 64 << 20}
MXNET = {"16 MiB": "MXNet 1.9.1: 18.5 ms vs bound 8.9 ms (2.1x)"}


def best_of(fn: Callable[[], None], repeats: int, inner: int, sync: Callable[[], None]) -> float:
    """Best (minimum) seconds per call over ``repeats`` runs of ``inner`` calls."""
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        times.append((time.perf_counter() - start) / inner)
    return min(times)


def interleaved(
    a: Callable[[], None], b: Callable[[], None], rounds: int, inner: int, sync
) -> tuple[float, float]:
    """Time ``a`` and ``b`` alternately (noise hits both alike); best of each."""
    ta, tb = [], []
    for _ in range(rounds):
        ta.append(best_of(a, 1, inner, sync))
        tb.append(best_of(b, 1, inner, sync))
    return min(ta), min(tb)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, no 64 MiB")
    parser.add_argument("--gpu", action="store_true", help="CuPy values on the device store")
    args = parser.parse_args()
    rounds = 3 if args.quick else 7

    if args.gpu:
        import cupy as xp

        n_gpus = labkv.num_gpus()
        devices = [labkv.gpu(i % n_gpus) for i in range(4)]
        kind = "device"

        def sync() -> None:
            xp.cuda.runtime.deviceSynchronize()

        def make(nbytes: int, device: labkv.Device):
            return labkv.to_device(np.ones(nbytes // 4, np.float32), device)
    else:
        xp = np
        devices = labkv.devices(4)
        kind = "local"

        def sync() -> None:
            return None

        def make(nbytes: int, device: labkv.Device):
            return labkv.ones(nbytes // 4, device=device)

    print(f"labkv {kind} store, 4 devices {devices}; bound: {xp.__name__} sum of 4 + 4 copies")
    print(
        f"{'size':>8} {'labkv ms':>10} {'bound ms':>10} {'ratio':>7}   target <= 1.3x at >= 1 MiB"
    )
    sizes = {k: v for k, v in SIZES.items() if not (args.quick and v > (16 << 20))}
    for label, nbytes in sizes.items():
        values = [make(nbytes, d) for d in devices]
        outs = [make(nbytes, d) for d in devices]
        kv = labkv.create(kind)
        kv.init(0, values[0])
        dst = make(nbytes, devices[0])

        def store_call(kv=kv, values=values, outs=outs) -> None:
            kv.push(0, values)
            kv.pull(0, out=outs)

        def bound(dst=dst, values=values, outs=outs) -> None:
            if not args.gpu:
                np.add(values[0], values[1], out=dst)
                np.add(dst, values[2], out=dst)
                np.add(dst, values[3], out=dst)
                for out in outs:
                    np.copyto(out, dst)
                return
            # A CuPy kernel takes operands on its current GPU only (without peer access
            # it raises): a value on another GPU is peer-copied onto dst's first, and
            # dst onto each out's GPU, as the device store does.
            with xp.cuda.Device(dst.device.id):
                here = [v if v.device == dst.device else xp.asarray(v) for v in values]
                xp.add(here[0], here[1], out=dst)
                xp.add(dst, here[2], out=dst)
                xp.add(dst, here[3], out=dst)
            for out in outs:
                with xp.cuda.Device(out.device.id):
                    out[...] = dst if out.device == dst.device else xp.asarray(dst)

        inner = max(1, int(2e7 // nbytes))
        t_store, t_bound = interleaved(store_call, bound, rounds, inner, sync)
        note = MXNET.get(label, "")
        print(
            f"{label:>8} {t_store * 1e3:10.3f} {t_bound * 1e3:10.3f} "
            f"{t_store / t_bound:6.2f}x   {note}"
        )

    kv = labkv.create(kind)
    tiny, tiny_out = make(4, devices[0]), make(4, devices[0])
    kv.init("tiny", tiny)

    def tiny_call() -> None:
        kv.push("tiny", tiny)
        kv.pull("tiny", out=tiny_out)

    per_call = statistics.median(best_of(tiny_call, 1, 2000, sync) for _ in range(rounds))
    print(
        f"tiny push+pull: {per_call * 1e6:.2f} us per call ({1 / per_call:,.0f} calls/s); "
        "target <= 15 us (MXNet 1.9.1: 70 us)"
    )

    keys = list(range(100))
    kv = labkv.create(kind)
    kv.init(keys, [tiny] * 100)
    values = [[make(4, d) for d in devices] for _ in keys]
    outs = [[make(4, d) for d in devices] for _ in keys]

    def many_call() -> None:
        kv.push(keys, values)
        kv.pull(keys, out=outs)

    per_call = statistics.median(best_of(many_call, 1, 50, sync) for _ in range(rounds))
    print(
        f"100 keys x 4 devices, one push + one pull: {per_call * 1e3:.3f} ms; "
        "target <= 1.5 ms (MXNet 1.9.1: 3.5 ms)"
    )


if __name__ == "__main__":
    main()
