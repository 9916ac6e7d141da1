"""Gradient compression: bit-exact with MXNet 1.9.1, per-element reference, wire format;
the vectorised codec against plain references (odd sizes, block edges, NaN and inf)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import labkv
import labkv.compression as compression
from labkv.compression import (
    GradientCompression,
    from_wire,
    pack_1bit,
    pack_2bit,
    sum_from_wire,
    to_wire,
    unpack_1bit,
    unpack_2bit,
    wire_piece,
)
from labkv.reduce import sum_into
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


# -- the vectorised codec against plain references ----------------------------------------
SIZES = [0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 100]
THRESHOLDS = {"2bit": [0.5, 0.1, 1e-30, 3.0, np.inf], "1bit": [0.0, 0.5, -0.25, np.inf, np.nan]}


def _plain_quantize(kind, threshold, grad, residual):
    """The rule as plain whole-array numpy, in float32 and MXNet's order (the
    codec's formulation before it worked in blocks)."""
    r = residual + grad.astype(np.float32)
    if kind == "2bit":
        t = np.float32(threshold)
        sent = np.where(r >= t, t, np.where(r <= -t, -t, np.float32(0))).astype(np.float32)
    else:
        sent = np.where(r > np.float32(threshold), np.float32(1), np.float32(-1))
        sent = sent.astype(np.float32)
    return sent, r - sent


def _plain_pack(kind, threshold, values):
    """Value by value, MXNet's layout: 2 bits (``11`` +t, ``10`` -t, else ``00``)
    or 1 bit (set for > 0) a value, the first value in the high bits."""
    per_byte, bits = (4, 2) if kind == "2bit" else (8, 1)
    t = np.float32(threshold)
    out = bytearray(-(-values.size // per_byte))
    for i, v in enumerate(values.reshape(-1).tolist()):
        code = (3 if v == t else 2 if v == -t else 0) if kind == "2bit" else int(v > 0)
        out[i // per_byte] |= code << (8 - bits * (i % per_byte + 1))
    return np.frombuffer(bytes(out), np.uint8)


def _plain_unpack(kind, threshold, packed, size):
    per_byte, bits = (4, 2) if kind == "2bit" else (8, 1)
    t = np.float32(threshold)
    values = []
    for i in range(size):
        code = (int(packed[i // per_byte]) >> (8 - bits * (i % per_byte + 1))) & (2**bits - 1)
        if kind == "2bit":
            values.append(t if code == 3 else -t if code == 2 else np.float32(0))
        else:
            values.append(np.float32(1) if code else np.float32(-1))
    return np.array(values, np.float32)


def _bits(a):
    """The bit patterns of a float32 array (NaN payloads and -0 included)."""
    return np.ascontiguousarray(a, np.float32).reshape(-1).view(np.uint32)


def _gradient(rng, size, threshold):
    """Normal values with specials put in: NaN, +-inf, +-0, +-t and its neighbours."""
    grad = rng.normal(0, 0.7, size).astype(np.float32)
    t = np.float32(threshold if np.isfinite(threshold) else 0.5)
    specials = np.float32(
        [np.nan, np.inf, -np.inf, 0.0, -0.0, t, -t, 2 * t, 1e-45, 3e38, -3e38]
        + [np.nextafter(t, np.float32(0)), np.nextafter(t, np.float32(np.inf))]
    )
    if size:
        where = rng.integers(0, size, max(1, size // 4))
        grad[where] = rng.choice(specials, where.size)
    return grad


@pytest.fixture(params=[8, 16, compression.BLOCK], ids=lambda b: f"block{b}")
def block(request, monkeypatch):
    """Small blocks make every size below cross block edges (BLOCK is a multiple of 8)."""
    monkeypatch.setattr(compression, "BLOCK", request.param)
    return request.param


@pytest.mark.parametrize("kind", ["2bit", "1bit"])
def test_quantize_and_encode_match_the_plain_rule_over_pushes(block, kind):
    rng = np.random.default_rng(7)
    for threshold in THRESHOLDS[kind]:
        gc = GradientCompression(kind, threshold)
        for size in SIZES:
            plain = ours = packed_residual = np.zeros(size, np.float32)
            for _ in range(4):  # the residual carries over from push to push
                grad = _gradient(rng, size, threshold)
                with np.errstate(all="ignore"):
                    want_sent, plain = _plain_quantize(kind, threshold, grad, plain)
                    sent, ours = gc.quantize(grad, ours)
                    codes, packed_residual = gc.encode(grad, packed_residual)
                np.testing.assert_array_equal(_bits(sent), _bits(want_sent))
                np.testing.assert_array_equal(_bits(ours), _bits(plain))
                np.testing.assert_array_equal(_bits(packed_residual), _bits(plain))
                np.testing.assert_array_equal(codes, _plain_pack(kind, threshold, want_sent))


def test_nan_and_inf_are_quantised_as_before():
    gc = GradientCompression("2bit", 0.5)
    grad = np.float32([np.nan, np.inf, -np.inf, 0.25])
    with np.errstate(all="ignore"):
        sent, residual = gc.quantize(grad, np.float32([0, 0, 0, np.nan]))
    np.testing.assert_array_equal(sent, [0, 0.5, -0.5, 0])  # NaN compares false: 0 sent
    np.testing.assert_array_equal(residual, [np.nan, np.inf, -np.inf, np.nan])
    gc = GradientCompression("1bit", 0.0)
    sent, residual = gc.quantize(np.float32([np.nan, np.inf, -np.inf]), np.zeros(3, np.float32))
    np.testing.assert_array_equal(sent, [-1, 1, -1])
    np.testing.assert_array_equal(residual, [np.nan, np.inf, -np.inf])


def test_quantize_writes_into_out_and_can_update_in_place(block):
    rng = np.random.default_rng(3)
    gc = GradientCompression("2bit", 0.5)
    grad, residual = rng.normal(0, 1, (5, 7)).astype(np.float32), np.full((5, 7), 0.3, np.float32)
    want_sent, want = _plain_quantize("2bit", 0.5, grad, residual)
    out = np.empty_like(residual)
    sent, new = gc.quantize(grad, residual, out=out)
    assert new is out and sent.shape == (5, 7)
    np.testing.assert_array_equal(residual, np.float32(0.3))  # not changed
    np.testing.assert_array_equal(new, want)
    codes, same = gc.encode(grad, residual, out=residual)
    assert same is residual
    np.testing.assert_array_equal(residual, want)
    np.testing.assert_array_equal(codes, pack_2bit(want_sent, 0.5))
    with pytest.raises(ValueError, match="C-contiguous float32"):
        gc.quantize(grad, want, out=np.empty((7, 5), np.float32))


def test_quantize_casts_other_gradient_dtypes_first_as_before():
    rng = np.random.default_rng(5)
    gc = GradientCompression("2bit", 0.5)
    residual = rng.normal(0, 0.3, 40).astype(np.float32)
    for dtype in (np.float64, np.float16, np.int32):
        grad = (rng.normal(0, 2, 40)).astype(dtype)
        want_sent, want = _plain_quantize("2bit", 0.5, grad, residual)
        sent, new = gc.quantize(grad, residual)
        np.testing.assert_array_equal(_bits(sent), _bits(want_sent))
        np.testing.assert_array_equal(_bits(new), _bits(want))
    strided = rng.normal(0, 1, (8, 5)).astype(np.float32).T  # not C-contiguous
    sent, new = gc.quantize(strided, np.zeros((5, 8), np.float32))
    np.testing.assert_array_equal(new, _plain_quantize("2bit", 0.5, strided, np.zeros((5, 8)))[1])


@pytest.mark.parametrize("kind", ["2bit", "1bit"])
def test_pack_and_unpack_match_a_value_by_value_reference(block, kind):
    rng = np.random.default_rng(11)
    for size in SIZES:
        values = _gradient(rng, size, 0.5)  # any values: only +-t (or > 0) set bits
        values[::3] = np.float32(0.5)
        values[1::5] = np.float32(-0.5)
        packed = pack_2bit(values, 0.5) if kind == "2bit" else pack_1bit(values)
        np.testing.assert_array_equal(packed, _plain_pack(kind, 0.5, values))
        noise = rng.integers(0, 256, packed.size).astype(np.uint8)  # 2-bit code 01 too
        got = unpack_2bit(noise, 0.5, size) if kind == "2bit" else unpack_1bit(noise, size)
        assert got.dtype == np.float32 and got.shape == (size,)
        np.testing.assert_array_equal(_bits(got), _bits(_plain_unpack(kind, 0.5, noise, size)))


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["2bit", "1bit"]),
    size=st.integers(0, 70),
    data=st.data(),
)
def test_a_piece_cut_from_the_codes_is_the_codes_of_the_piece_alone(kind, size, data):
    start = data.draw(st.integers(0, size))
    stop = data.draw(st.integers(start, size))
    rng = np.random.default_rng(size)
    values = (
        rng.choice(np.float32([-0.5, 0.0, 0.5]), size)
        if kind == "2bit"
        else rng.choice(np.float32([-1.0, 1.0]), size)
    )
    codes = to_wire(kind, 0.5, [values])[0]
    before = codes.copy()
    piece = wire_piece(kind, codes, start, stop)
    np.testing.assert_array_equal(piece, to_wire(kind, 0.5, [values[start:stop]])[0])
    np.testing.assert_array_equal(codes, before)  # the whole value's codes are unchanged


def test_the_sum_of_the_wire_rows_adds_like_sum_into():
    rng = np.random.default_rng(2)
    for kind, threshold in (("2bit", 0.1), ("2bit", 0.3), ("1bit", 0.0)):
        for size in (1, 5, 37):
            sent = [
                GradientCompression(kind, threshold).quantize(
                    rng.normal(0, 1, size).astype(np.float32), np.zeros(size, np.float32)
                )[0]
                for _ in range(3)
            ]
            codes = to_wire(kind, threshold, sent)
            want = np.empty(size, np.float32)
            sum_into(want, from_wire(kind, threshold, codes, size))
            np.testing.assert_array_equal(sum_from_wire(kind, threshold, codes, size), want)
            one = sum_from_wire(kind, threshold, codes[:1], size)
            np.testing.assert_array_equal(one, sent[0])


def test_compress_reuses_released_residuals_and_a_push_never_committed_leaves_them():
    gc = GradientCompression("2bit", 0.5)
    rng = np.random.default_rng(4)
    grads = [rng.normal(0, 0.6, 50).astype(np.float32) for _ in range(5)]
    plain = np.zeros(50, np.float32)
    _, commit = gc.compress([("w", [grads[0]])])
    gc.release(commit())  # a first push replaced nothing
    plain = _plain_quantize("2bit", 0.5, grads[0], plain)[1]
    for packed in (False, True):
        for grad in grads[1:3]:
            old = gc.residuals[("w", 0)]
            sent, commit = gc.compress([("w", [grad])], packed=packed)
            want_sent, plain = _plain_quantize("2bit", 0.5, grad, plain)
            got = sent[0][1][0]
            np.testing.assert_array_equal(got, pack_2bit(want_sent, 0.5) if packed else want_sent)
            np.testing.assert_array_equal(old, gc.residuals[("w", 0)])  # not yet committed
            replaced = commit()
            assert replaced[("w", 0)] is old
            np.testing.assert_array_equal(gc.residuals[("w", 0)], plain)
            gc.release(replaced)
    spare = gc._spare[("w", 0)]
    current = gc.residuals[("w", 0)].copy()
    _, commit = gc.compress([("w", [grads[3]])])  # written into the released array
    replaced = commit()
    assert gc.residuals[("w", 0)] is spare
    gc.restore(replaced)  # a push that failed later: the array it replaced comes back
    np.testing.assert_array_equal(gc.residuals[("w", 0)], current)
    _, commit = gc.compress([("w", [grads[4]])])  # a failed push: never committed
    np.testing.assert_array_equal(gc.residuals[("w", 0)], current)
    _, commit = gc.compress([("w", [grads[4]])])
    commit()
    want = _plain_quantize("2bit", 0.5, grads[4], current)[1]
    np.testing.assert_array_equal(gc.residuals[("w", 0)], want)


def test_a_local_stores_residual_arrays_are_reused_push_after_push():
    kv = labkv.create("local")
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    kv.init("w", np.zeros(10, np.float32))
    kv.push("w", np.full(10, 0.3, np.float32))
    kv.push("w", np.full(10, 0.3, np.float32))
    first = kv._compression.residuals[("w", 0)]
    kv.push("w", np.full(10, 0.3, np.float32))
    kv.push("w", np.full(10, 0.3, np.float32))
    assert kv._compression.residuals[("w", 0)] is first  # two arrays, taking turns
    np.testing.assert_array_equal(kv.pull("w"), np.float32(0.5))  # pushes 2 and 4 sent 0.5
    np.testing.assert_allclose(first, 0.2, rtol=1e-5)  # 4 * 0.3 - 2 * 0.5
