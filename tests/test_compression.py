"""Gradient compression: bit-exact with MXNet 1.9.1, per-element reference, wire format."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import labkv
from labkv.compression import (
    GradientCompression,
    pack_1bit,
    pack_2bit,
    unpack_1bit,
    unpack_2bit,
)
from tests._reference import f32, reference

CASES = reference()["compression"]


@pytest.mark.parametrize("case", CASES, ids=[f"{c['type']}-{i}" for i, c in enumerate(CASES)])
def test_2bit_on_device_store_is_bit_exact_with_mxnet(case):
    kv = labkv.create("device")
    kv.set_gradient_compression(case["compression_params"])
    kv.init(0, f32(case["weight0"]))
    devices = labkv.devices(case["num_devices"])
    for push, expected in zip(case["pushes"], case["pulled"], strict=True):
        kv.push(0, [labkv.array(g, device=d, dtype="float32") for g, d in zip(push, devices)])
        np.testing.assert_array_equal(kv.pull(0), f32(expected))


def _reference_2bit(pushes, threshold):
    """Element by element, in float32, the rule MXNet's quantize_2bit kernel applies."""
    t = np.float32(threshold)
    residual = [np.float32(0)] * len(pushes[0])
    pulled = []
    for grad in pushes:
        sent = []
        for i, g in enumerate(grad):
            r = np.float32(residual[i] + np.float32(g))
            if r >= t:
                r, q = np.float32(r - t), t
            elif r <= -t:
                r, q = np.float32(r + t), -t
            else:
                q = np.float32(0)
            residual[i] = r
            sent.append(q)
        pulled.append(np.array(sent, dtype=np.float32))
    return pulled


@settings(max_examples=40, deadline=None)
@given(
    pushes=st.lists(
        st.lists(st.floats(-2, 2, width=32), min_size=5, max_size=5), min_size=1, max_size=6
    ),
    threshold=st.sampled_from([0.1, 0.25, 0.5, 1.0]),
)
def test_2bit_matches_a_per_element_reference_over_several_pushes(pushes, threshold):
    kv = labkv.create("local")
    kv.set_gradient_compression({"type": "2bit", "threshold": threshold})
    kv.init("g", np.zeros(5, np.float32))
    for push, expected in zip(pushes, _reference_2bit(pushes, threshold), strict=True):
        kv.push("g", f32(push))
        np.testing.assert_array_equal(kv.pull("g"), expected)


def test_each_device_keeps_its_own_residual():
    kv = labkv.create("device")
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    kv.init(0, np.zeros(1, np.float32))
    # device 0 pushes 0.3 twice (sends 0 then 0.5); device 1 pushes 0 (sends nothing)
    kv.push(0, [f32([0.3]), f32([0.0])])
    assert kv.pull(0)[0] == 0
    kv.push(0, [f32([0.3]), f32([0.0])])
    assert kv.pull(0)[0] == np.float32(0.5)


def test_1bit_sends_plus_or_minus_one_and_keeps_the_rest():
    gc = GradientCompression("1bit", 0.0)
    sent, residual = gc.quantize(f32([0.3, -0.2, 0.0]), np.zeros(3, np.float32))
    np.testing.assert_array_equal(sent, [1, -1, -1])
    np.testing.assert_array_equal(residual, f32([0.3, -0.2, 0.0]) - sent)


def test_failed_push_leaves_residuals_unchanged():
    kv = labkv.create("local")
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    kv.init(0, np.zeros(2, np.float32))

    def bad(key, merged, stored):
        raise RuntimeError("no")

    kv.push(0, f32([0.3, 0.3]))  # residual 0.3 stays behind
    kv.set_updater(bad)
    with pytest.raises(RuntimeError):
        kv.push(0, f32([0.3, 0.3]))
    kv.set_updater(lambda key, merged, stored: stored.__setitem__(Ellipsis, merged))
    kv.push(0, f32([0.1, 0.1]))  # 0.3 + 0.1 < 0.5: nothing sent if the failed push left no trace
    np.testing.assert_array_equal(kv.pull(0), [0, 0])


@pytest.mark.parametrize(
    "params, error, match",
    [
        ({"type": "3bit"}, ValueError, "unknown gradient compression type"),
        ({"type": "2bit", "threshold": 0}, ValueError, "threshold > 0"),
        ({"threshold": 0.5}, ValueError, "need a 'type'"),
        ({"type": "2bit", "thresh": 0.5}, ValueError, "unknown gradient compression param"),
        ("2bit", TypeError, "must be a dict"),
    ],
)
def test_bad_compression_params_are_refused(params, error, match):
    kv = labkv.create("device")
    with pytest.raises(error, match=match):
        kv.set_gradient_compression(params)


def test_compression_refuses_non_float32_keys_and_changes_nothing():
    kv = labkv.create("local")
    kv.set_gradient_compression({"type": "2bit"})
    kv.init([0, 1], [np.zeros(2, np.float32), np.zeros(2, np.float64)])
    with pytest.raises(TypeError, match="float32 values only; key 1 is float64"):
        kv.push([0, 1], [f32([1, 1]), np.ones(2)])
    np.testing.assert_array_equal(kv.pull(0), [0, 0])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from([-0.5, 0.0, 0.5]), min_size=1, max_size=70))
def test_2bit_wire_format_round_trips(values):
    sent = f32(values)
    packed = pack_2bit(sent, 0.5)
    assert packed.nbytes == -(-sent.size // 4)
    np.testing.assert_array_equal(unpack_2bit(packed, 0.5, sent.size), sent)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from([-1.0, 1.0]), min_size=1, max_size=70))
def test_1bit_wire_format_round_trips(values):
    sent = f32(values)
    packed = pack_1bit(sent)
    assert packed.nbytes == -(-sent.size // 8)
    np.testing.assert_array_equal(unpack_1bit(packed, sent.size), sent)
