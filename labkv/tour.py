"""A runnable tour of the MXNet KVStore tutorial on labkv: ``python -m labkv.tour``.

It runs every step of MXNet's tutorial (init, push, aggregate, update, pull,
lists of keys, several devices) and prints each value beside the one MXNet
prints, on GPUs when there are four, else on four simulated CPU devices.
"""

from __future__ import annotations

from typing import Any

import labkv


def _show(step: str, value: Any, expected: float) -> float:
    got = float(value.ravel()[0])
    mark = "ok" if got == expected else f"EXPECTED {expected}"
    print(f"{step:<48} -> {got:g}   ({mark})")
    return got


def run(num_devices: int = 4) -> list[float]:
    """Run the tutorial and return the pulled values (2, 8, 4, 4, 6, 6, 3, 11).

    >>> run() == [2, 8, 4, 4, 6, 6, 3, 11]  # doctest: +ELLIPSIS
    kv = labkv.create('local') ...
    True
    """
    shape = (2, 3)
    devs = labkv.devices(num_devices)
    print(f"kv = labkv.create('local') on {num_devices} devices: {devs}")
    kv = labkv.create("local")
    got = []
    kv.init(3, labkv.ones(shape) * 2)
    a = labkv.zeros(shape)
    kv.pull(3, out=a)
    got.append(_show("init 3 with 2s, pull", a, 2))
    kv.push(3, labkv.ones(shape) * 8)
    kv.pull(3, out=a)
    got.append(_show("push 8s, pull", a, 8))
    kv.push(3, [labkv.ones(shape, device=d) for d in devs])
    kv.pull(3, out=a)
    got.append(_show(f"push ones from {num_devices} devices (summed), pull", a, num_devices))

    def update(key: Any, merged: Any, stored: Any) -> None:
        print(f"    update on key: {key}")
        stored += merged * 2

    kv.set_updater(update)
    kv.pull(3, out=a)
    got.append(_show("set updater 'stored += input * 2', pull", a, num_devices))
    kv.push(3, labkv.ones(shape))
    kv.pull(3, out=a)
    got.append(_show("push ones, pull", a, num_devices + 2))
    b = [labkv.ones(shape, device=d) for d in devs]
    kv.pull(3, out=b)
    got.append(_show("pull into every device, b[1]", b[1], num_devices + 2))
    keys = [5, 7, 9]
    kv.init(keys, [labkv.ones(shape)] * len(keys))
    kv.push(keys, [labkv.ones(shape)] * len(keys))
    b = [labkv.zeros(shape) for _ in keys]
    kv.pull(keys, out=b)
    got.append(_show("keys [5, 7, 9]: init ones, push ones, pull b[1]", b[1], 3))
    kv.push(keys, [[labkv.ones(shape, device=d) for d in devs] for _ in keys])
    c = [[labkv.zeros(shape, device=d) for d in devs] for _ in keys]
    kv.pull(keys, out=c)
    got.append(_show("push ones from every device per key, c[1][1]", c[1][1], 3 + 2 * num_devices))
    return got


if __name__ == "__main__":
    run()
