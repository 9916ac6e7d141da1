"""Optimizers and learning-rate schedules against MXNet 1.9.1's numbers."""

from __future__ import annotations

import json
import math
import re

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


# -- per-key multipliers (MXNet's set_lr_mult / set_wd_mult) ---------------------------
#: Each optimizer's options beside learning_rate=0.1 and wd=0.1 (AdaDelta has no rate).
MULTIPLIED = {
    "sgd": {"momentum": 0.5},
    "nag": {"momentum": 0.5},
    "adam": {},
    "adagrad": {},
    "rmsprop": {},
    "adadelta": {},
    "signum": {"momentum": 0.5},
    "signsgd": {},
}


def _steps(opt, keys, steps=4):
    """Each key's weight after ``steps`` updates with the same gradients."""
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(5).astype(np.float32) for _ in range(steps)]
    weights = {k: np.linspace(-1, 1, 5, dtype=np.float32) for k in keys}
    states = {k: opt.create_state(k, weights[k]) for k in keys}
    for g in grads:
        for k in keys:
            opt.update(k, weights[k], g.copy(), states[k])
    return weights


@pytest.mark.parametrize("keys", [(0, 1), ("w", "b")], ids=["int-keys", "str-keys"])
@pytest.mark.parametrize("name", sorted(MULTIPLIED))
def test_multipliers_change_exactly_the_updates_of_their_keys(name, keys):
    # Multipliers that are powers of two make lr*mult and wd*mult exact, so the
    # scaled key must match, bit for bit, an optimizer built with those values.
    kw = {"learning_rate": 0.1, "wd": 0.1, **MULTIPLIED[name]}
    plain = _steps(optimizers.create(name, **kw), keys)
    opt = optimizers.create(name, **kw)
    opt.set_lr_mult({keys[1]: 0.25})
    opt.set_wd_mult({keys[1]: 0.5})
    scaled = _steps(opt, keys)
    expected = _steps(optimizers.create(name, **{**kw, "learning_rate": 0.025, "wd": 0.05}), keys)
    np.testing.assert_array_equal(scaled[keys[0]], plain[keys[0]])  # an unlisted key: 1
    np.testing.assert_array_equal(scaled[keys[1]], expected[keys[1]])
    assert not np.array_equal(scaled[keys[1]], plain[keys[1]])


def test_an_lr_multiplier_scales_the_scheduled_rate_and_zero_freezes_the_key():
    sched = lr_scheduler.FactorScheduler(step=1, factor=0.5)
    opt = optimizers.SGD(learning_rate=0.8, lr_scheduler=sched, wd=0.1)
    opt.set_lr_mult({"slow": 0.25, "frozen": 0.0})
    opt.num_update = 3  # the scheduler's rate: 0.8 * 0.5**2
    assert [opt._get_lr(k) for k in ("other", "slow", "frozen")] == [0.2, 0.05, 0.0]
    w = np.ones(3, np.float32)
    opt.update("frozen", w, np.ones(3, np.float32), opt.create_state("frozen", w))
    np.testing.assert_array_equal(w, np.ones(3, np.float32))  # no step, no decay
    opt.set_lr_mult({})  # replaces, as MXNet's: no multiplier is left
    assert opt.lr_mult == {} and opt._get_lr("slow") == opt.learning_rate


def test_multipliers_survive_the_config_round_trip_through_json():
    opt = optimizers.Adam(learning_rate=0.1, wd=0.01)
    opt.set_lr_mult({"b": 0.5, 2: 0.0})
    opt.set_wd_mult({3: 0.0})
    config = json.loads(json.dumps(opt.to_config()))  # as a state file keeps it
    assert config["params"]["lr_mult"] == [[2, 0.0], ["b", 0.5]]  # an int key stays an int
    twin = optimizers.Optimizer.from_config(config)
    assert twin.lr_mult == {2: 0.0, "b": 0.5} and twin.wd_mult == {3: 0.0}
    assert twin.to_config() == opt.to_config() and repr(twin) == repr(opt)
    keys = [2, 3, "b", "c"]
    for k, (a, b) in zip(keys, zip(_steps(opt, keys).values(), _steps(twin, keys).values())):
        np.testing.assert_array_equal(a, b, err_msg=str(k))
    plain = optimizers.Adam(learning_rate=0.1, wd=0.01)
    assert plain.to_config()["params"].keys() == {*opt._params}  # none set: no entry


def test_multipliers_travel_in_a_state_file_with_the_optimizer(tmp_path):
    kv = labkv.create()
    kv.init([0, 1], [np.ones(2, np.float32)] * 2)
    opt = optimizers.SGD(learning_rate=0.5, momentum=0.9)
    opt.set_lr_mult({1: 0.0})
    kv.set_optimizer(opt)
    kv.push([0, 1], [np.ones(2, np.float32)] * 2)
    kv.save_optimizer_states(tmp_path / "states", dump_optimizer=True)
    fresh = labkv.create()
    fresh.init([0, 1], kv.pull([0, 1]))
    fresh.load_optimizer_states(tmp_path / "states")
    assert fresh._optimizer.lr_mult == {1: 0.0}
    np.testing.assert_array_equal(fresh.pull(1), np.ones(2, np.float32))


@pytest.mark.parametrize("keys", [(0, 1), ("w", "b")], ids=["int-keys", "str-keys"])
def test_a_dist_stores_servers_use_the_multipliers_of_the_key_they_update(keys):
    # Real servers in-process, messages pickled as on the wire; 10 floats over a
    # bound of 4: key keys[1] is sliced over both servers, each updating its part.
    from tests._inprocess import InProcessCluster

    def make():
        opt = optimizers.SGD(learning_rate=0.1, momentum=0.9, wd=0.1)
        opt.set_lr_mult({keys[1]: 0.5})
        opt.set_wd_mult({keys[0]: 0.0})
        return opt

    shapes = [(3,), (10,)]
    with InProcessCluster(num_workers=1, bigarray_bound=4) as c:
        (kv,) = c.ranks
        local = labkv.create()
        for store in (kv, local):
            store.init(list(keys), [np.ones(s, np.float32) for s in shapes])
            store.set_optimizer(make())
            for step in range(3):
                store.push(list(keys), [np.full(s, step + 1.0, np.float32) for s in shapes])
        for key in keys:
            np.testing.assert_array_equal(kv.pull(key), local.pull(key), err_msg=str(key))
    unscaled = labkv.create()
    unscaled.init(list(keys), [np.ones(s, np.float32) for s in shapes])
    unscaled.set_optimizer(optimizers.SGD(learning_rate=0.1, momentum=0.9, wd=0.1))
    for step in range(3):
        unscaled.push(list(keys), [np.full(s, step + 1.0, np.float32) for s in shapes])
    for key in keys:
        assert not np.array_equal(unscaled.pull(key), local.pull(key))


def test_bad_multipliers_are_refused():
    opt = optimizers.SGD()
    with pytest.raises(TypeError, match="set_lr_mult takes a dict of key to multiplier"):
        opt.set_lr_mult([("w", 0.5)])
    with pytest.raises(TypeError, match=r"set_wd_mult: key \(1, 2\) is not an int or a str"):
        opt.set_wd_mult({(1, 2): 0.0})
    with pytest.raises(ValueError, match="could not convert"):
        opt.set_lr_mult({"w": "fast"})
    assert opt.lr_mult == {} and opt.wd_mult == {}


def test_a_positional_learning_rate_is_refused_naming_the_keyword():
    # MXNet's first positional argument is momentum (SGD, NAG, Signum) or beta1 (Adam).
    with pytest.raises(
        TypeError, match=r"learning_rate is a keyword: SGD\(learning_rate=0.1, momentum=0.9\)"
    ):
        optimizers.SGD(0.1, momentum=0.9)
    with pytest.raises(
        TypeError, match=r"SignSGD\(\*\*kwargs\): too many positional .*keywords only"
    ):
        optimizers.SignSGD(0.1)
    # What binds is MXNet's meaning, unchanged: SGD(0.9) is momentum 0.9.
    sgd = optimizers.SGD(0.9, learning_rate=0.1)
    assert (sgd.momentum, sgd.lr) == (0.9, 0.1)
    assert (
        optimizers.Adam(0.5).lr == optimizers.Adam.default_lr and optimizers.Adam(0.5).beta1 == 0.5
    )


def test_the_docs_optimizer_calls_run():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    texts = [(root / "README.md").read_text()] + [
        p.read_text() for p in (root / "docs").glob("*.md")
    ]
    calls = [c for t in texts for c in re.findall(r"labkv\.optimizers\.[A-Z]\w*\([^()]*\)", t)]
    assert calls
    for call in calls:
        assert isinstance(eval(call, {"labkv": labkv}), optimizers.Optimizer), call
