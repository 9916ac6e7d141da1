"""Optimizers and learning-rate schedules against MXNet 1.9.1's numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

import labkv
from labkv import lr_scheduler, optimizers
from tests._reference import f32, reference

CASES = reference()["optimizers"]
SCHEDULES = reference()["lr_schedulers"]


def _build(case):
    params = dict(case["params"])
    sched = case["lr_scheduler"]
    if sched:
        params["lr_scheduler"] = lr_scheduler.create(sched["name"], sched["params"])
    name = case["optimizer"]
    if name == "signum" and params.get("momentum") == 0:
        name = "signsgd"  # MXNet runs its signsgd kernel for Signum(momentum=0)
    return optimizers.create(name, **params)


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_optimizer_on_store_matches_mxnet(case):
    kv = labkv.create("local")
    key = case["key"]
    kv.init(key, f32(case["weight0"]))
    kv.set_optimizer(_build(case))
    devices = labkv.devices(case["num_devices"])
    for step, (grads, expected) in enumerate(zip(case["grads"], case["weights"], strict=True)):
        kv.push(key, [labkv.array(g, device=d, dtype="float32") for g, d in zip(grads, devices)])
        got = kv.pull(key)
        np.testing.assert_allclose(
            got, f32(expected), rtol=2e-6, atol=2e-7, err_msg=f"step {step + 1}"
        )


def test_reference_covers_every_optimizer():
    names = {c["optimizer"] for c in CASES}
    assert names >= {"sgd", "nag", "adam", "adagrad", "rmsprop", "adadelta", "signum"}
    assert any(c["params"].get("centered") for c in CASES)
    assert any(c["lr_scheduler"] for c in CASES)


@pytest.mark.parametrize(
    "case", SCHEDULES, ids=[f"{c['name']}-{i}" for i, c in enumerate(SCHEDULES)]
)
def test_lr_scheduler_matches_mxnet(case):
    sched = lr_scheduler.create(case["name"], case["params"])
    for n, expected in zip(case["num_updates"], case["lrs"], strict=True):
        assert math.isclose(sched(n), expected, rel_tol=1e-12, abs_tol=1e-15), n


def test_adam_bias_correction_uses_each_keys_own_count():
    # Two keys updated a different number of times: Adam's first step on the
    # second key must be the same as a first step on a fresh optimizer.
    opt = optimizers.Adam(learning_rate=0.1)
    w1, w2 = np.ones(3, np.float32), np.ones(3, np.float32)
    s1, s2 = opt.create_state(1, w1), opt.create_state(2, w2)
    for _ in range(3):
        opt.update(1, w1, np.full(3, 0.5, np.float32), s1)
    opt.update(2, w2, np.full(3, 0.5, np.float32), s2)
    fresh = optimizers.Adam(learning_rate=0.1)
    w3 = np.ones(3, np.float32)
    fresh.update(0, w3, np.full(3, 0.5, np.float32), fresh.create_state(0, w3))
    np.testing.assert_array_equal(w2, w3)
    assert opt.num_update == 3


def test_unknown_optimizer_and_scheduler_names():
    with pytest.raises(ValueError, match="unknown optimizer 'sgdd'.*adam"):
        optimizers.create("sgdd")
    with pytest.raises(ValueError, match="unknown lr scheduler"):
        lr_scheduler.create("sawtooth")


def test_optimizer_config_round_trip_rebuilds_the_same_updates():
    opt = optimizers.SGD(
        learning_rate=0.3,
        momentum=0.9,
        wd=0.01,
        lr_scheduler=lr_scheduler.FactorScheduler(step=2, factor=0.5),
    )
    twin = optimizers.Optimizer.from_config(opt.to_config())
    w1, w2 = np.ones(4, np.float32), np.ones(4, np.float32)
    s1, s2 = opt.create_state(0, w1), twin.create_state(0, w2)
    for i in range(5):
        g = np.full(4, i - 2.0, np.float32)
        opt.update(0, w1, g.copy(), s1)
        twin.update(0, w2, g.copy(), s2)
    np.testing.assert_array_equal(w1, w2)
    assert type(twin) is optimizers.SGD and twin.lr_scheduler.step == 2


def test_set_optimizer_by_name_and_bad_optimizer():
    kv = labkv.create()
    kv.init(0, np.zeros(2, np.float32))
    kv.set_optimizer("sgd", learning_rate=0.5)
    kv.push(0, [np.ones(2, np.float32)] * 2)
    np.testing.assert_array_equal(kv.pull(0), [-1, -1])
    with pytest.raises(TypeError, match="labkv optimizer"):
        kv.set_optimizer(object())
