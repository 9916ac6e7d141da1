"""The MXNet KVStore tutorial, line by line, on 4 simulated devices, against MXNet's numbers."""

from __future__ import annotations

import numpy as np
import pytest

import labkv
from tests._reference import f32, reference

SHAPE = (2, 3)
STEPS = [
    "init_pull",
    "push8_pull",
    "push4dev_pull",
    "set_updater_pull",
    "push1_updater_pull",
    "pull_4dev_b1",
    "multikey_push_pull_b1",
    "multikey_4dev_c11",
]


@pytest.mark.parametrize("kind", ["local", "device"])
def test_tutorial_values_and_updater_calls_match_mxnet(kind):
    ref = reference()["tutorial"]
    gpus = labkv.devices(4)
    kv = labkv.create(kind)
    got, calls = [], []

    kv.init(3, labkv.ones(SHAPE) * 2)
    a = labkv.zeros(SHAPE)
    kv.pull(3, out=a)
    got.append(a.copy())
    kv.push(3, labkv.ones(SHAPE) * 8)
    kv.pull(3, out=a)
    got.append(a.copy())
    kv.push(3, [labkv.ones(SHAPE, device=d) for d in gpus])
    kv.pull(3, out=a)
    got.append(a.copy())

    def update(key, merged, stored):
        calls.append(key)
        stored += merged * 2

    kv._set_updater(update)
    kv.pull(3, out=a)
    got.append(a.copy())
    kv.push(3, labkv.ones(SHAPE))
    kv.pull(3, out=a)
    got.append(a.copy())
    b = [labkv.ones(SHAPE, device=d) for d in gpus]
    kv.pull(3, out=b)
    got.append(b[1].copy())
    assert [labkv.device_of(x) for x in b] == gpus

    keys = [5, 7, 9]
    kv.init(keys, [labkv.ones(SHAPE)] * len(keys))
    kv.push(keys, [labkv.ones(SHAPE)] * len(keys))
    b = [labkv.zeros(SHAPE)] * len(keys)
    kv.pull(keys, out=b)
    got.append(b[1].copy())
    b = [[labkv.ones(SHAPE, device=d) for d in gpus]] * len(keys)
    kv.push(keys, b)
    c = [[labkv.zeros(SHAPE, device=d) for d in gpus]] * len(keys)
    kv.pull(keys, out=c)
    got.append(c[1][1].copy())

    assert [float(g[0, 0]) for g in got] == ref["scalar_sequence"] == [2, 8, 4, 4, 6, 6, 3, 11]
    for g, name in zip(got, STEPS, strict=True):
        np.testing.assert_array_equal(g, f32(ref[name]))
    assert calls == ref["updater_calls"] == [3, 5, 7, 9, 5, 7, 9]


def test_tour_prints_the_tutorial(capsys):
    from labkv import tour

    assert tour.run() == [2, 8, 4, 4, 6, 6, 3, 11]
    printed = capsys.readouterr().out
    assert "update on key: 9" in printed and "EXPECTED" not in printed
