"""Property tests of the store: sums, pulls on every device, optimizer-state files."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import labkv

shapes = hnp.array_shapes(min_dims=1, max_dims=3, max_side=5)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), shape=shapes, n=st.integers(1, 5), kind=st.sampled_from(["local", "device"]))
def test_pushed_list_equals_its_sum_and_every_device_pulls_it(data, shape, n, kind):
    elements = st.floats(-1e3, 1e3, width=32)
    arrays = [data.draw(hnp.arrays(np.float32, shape, elements=elements)) for _ in range(n)]
    devices = labkv.devices(n)
    kv = labkv.create(kind)
    kv.init("k", np.zeros(shape, np.float32))
    kv.push("k", [labkv.to_device(a, d) for a, d in zip(arrays, devices)])
    expected = arrays[0].copy()
    for a in arrays[1:]:
        expected += a  # left to right, in float32: the store's order
    outs = [labkv.zeros(shape, device=d) for d in devices]
    kv.pull("k", out=outs)
    for out, device in zip(outs, devices):
        np.testing.assert_array_equal(out, expected)
        assert labkv.device_of(out) == device


OPTIMIZERS = [
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9}),
    ("nag", {"momentum": 0.5}),
    ("adam", {}),
    ("adagrad", {}),
    ("rmsprop", {"centered": True}),
    ("adadelta", {}),
    ("signum", {}),
    ("sgd", {}),
]


@settings(max_examples=25, deadline=None)
@given(
    which=st.sampled_from(OPTIMIZERS),
    steps_before=st.integers(1, 4),
    steps_after=st.integers(1, 3),
    str_keys=st.booleans(),
    dump=st.booleans(),
)
def test_save_and_load_optimizer_states_round_trips(
    tmp_path_factory, which, steps_before, steps_after, str_keys, dump
):
    name, params = which
    keys = ["a", "b"] if str_keys else [3, 4]
    rng = np.random.default_rng(steps_before)
    grads = [
        rng.standard_normal((2, 3)).astype(np.float32) for _ in range(steps_before + steps_after)
    ]

    def make():
        kv = labkv.create()
        kv.init(keys, [np.ones((2, 3), np.float32), np.ones(3, np.float32)])
        kv.set_optimizer(name, **params)
        return kv

    straight = make()
    for g in grads:
        straight.push(keys[0], g)

    first = make()
    for g in grads[:steps_before]:
        first.push(keys[0], g)
    path = tmp_path_factory.mktemp("states") / "opt.states"
    first.save_optimizer_states(path, dump_optimizer=dump)
    assert path.exists()  # written to exactly the given name, no suffix added

    resumed = labkv.create()
    resumed.init(keys, [first.pull(keys[0]), np.ones(3, np.float32)])
    if dump:
        resumed.set_optimizer("sgd")  # the file's own optimizer must replace this one
    else:
        resumed.set_optimizer(name, **params)
    resumed.load_optimizer_states(path)
    assert resumed._optimizer.to_config()["name"] == name
    for g in grads[steps_before:]:
        resumed.push(keys[0], g)
    np.testing.assert_array_equal(resumed.pull(keys[0]), straight.pull(keys[0]))


def test_loading_refuses_unknown_keys_wrong_shapes_and_foreign_files(tmp_path):
    kv = labkv.create()
    kv.init([0, 1], [np.zeros(2, np.float32), np.zeros(3, np.float32)])
    kv.set_optimizer("adam")
    kv.push([0, 1], [np.ones(2, np.float32), np.ones(3, np.float32)])
    path = tmp_path / "s"
    kv.save_optimizer_states(path)

    other = labkv.create()
    other.init(0, np.zeros(2, np.float32))
    other.set_optimizer("adam")
    with pytest.raises(ValueError, match=r"key 1, which this store does not have"):
        other.load_optimizer_states(path)

    reshaped = labkv.create()
    reshaped.init([0, 1], [np.zeros(2, np.float32), np.zeros(4, np.float32)])
    reshaped.set_optimizer("adam")
    with pytest.raises(ValueError, match=r"\(key 1, state 0\) holds shape \(3,\), not \(4,\)"):
        reshaped.load_optimizer_states(path)

    pickled = tmp_path / "pickled.npy"
    np.save(pickled, np.array([{"evil": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError):
        kv.load_optimizer_states(pickled)
    with pytest.raises(RuntimeError, match="no optimizer is set"):
        labkv.create().save_optimizer_states(tmp_path / "none")
