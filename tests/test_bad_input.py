"""Bad input gets a clear error and changes nothing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import labkv

SHAPE = (2, 3)


def snapshot(kv):
    return {k: kv.pull(k).copy() for k in kv}


def assert_unchanged(kv, before):
    after = snapshot(kv)
    assert after.keys() == before.keys()
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=f"key {k!r} changed")


@pytest.fixture(params=["local", "device"])
def kv(request):
    store = labkv.create(request.param)
    store.init([0, 1], [np.zeros(SHAPE, np.float32), np.ones(SHAPE, np.float32)])
    return store


def ones(shape=SHAPE):
    return np.ones(shape, np.float32)


BAD_CALLS = [
    # (description, call, error type, message pattern)
    ("push unknown key", lambda kv: kv.push(5, ones()), KeyError, "key 5 is not initialised"),
    ("pull unknown key", lambda kv: kv.pull(5), KeyError, "key 5 is not initialised"),
    (
        "push list with one unknown key",
        lambda kv: kv.push([0, 5], [ones(), ones()]),
        KeyError,
        "key 5",
    ),
    (
        "init existing",
        lambda kv: kv.init([7, 1], [ones(), ones()]),
        ValueError,
        "key 1 is already initialised",
    ),
    (
        "push wrong shape",
        lambda kv: kv.push(0, np.ones((3, 2), np.float32)),
        ValueError,
        r"key 0 has shape \(3, 2\), but the stored value has shape \(2, 3\)",
    ),
    (
        "push list, second key wrong shape",
        lambda kv: kv.push([0, 1], [ones(), [ones(), ones((4,))]]),
        ValueError,
        "key 1 has shape",
    ),
    (
        "pull into wrong shape",
        lambda kv: kv.pull([0, 1], out=[np.zeros(SHAPE), np.zeros(2)]),
        ValueError,
        "out for key 1 has shape",
    ),
    (
        "keys/values length",
        lambda kv: kv.push([0, 1], [ones()]),
        ValueError,
        "2 keys but 1 values",
    ),
    (
        "keys/values length is a TypeError too",
        lambda kv: kv.push([0, 1], [ones()]),
        TypeError,
        "2 keys",
    ),
    ("float key", lambda kv: kv.push(1.0, ones()), TypeError, "int or str, got float"),
    ("None key", lambda kv: kv.pull(None), TypeError, "int or str, got NoneType"),
    ("bytes key", lambda kv: kv.init(b"k", ones()), TypeError, "int or str, got bytes"),
    ("bool key", lambda kv: kv.push(True, ones()), TypeError, "got bool"),
    ("str key in int store", lambda kv: kv.init("w", ones()), TypeError, "uses int keys"),
    (
        "mixed key kinds in one call",
        lambda kv: kv.push([0, "w"], [ones(), ones()]),
        TypeError,
        "uses int keys",
    ),
    (
        "non-numeric value",
        lambda kv: kv.push(0, np.array([["a"] * 3] * 2)),
        TypeError,
        "non-numeric dtype",
    ),
    ("not an array", lambda kv: kv.push(0, [1.0, 2.0]), TypeError, "must be an array"),
    ("no keys but a value", lambda kv: kv.push([], [ones()]), ValueError, "0 keys but 1 values"),
    (
        "row ids that are not whole numbers",
        lambda kv: kv.row_sparse_pull(0, row_ids=np.array([1.0, 0.5], np.float32)),
        ValueError,
        "row_ids for key 0 must be whole numbers; got 0.5",
    ),
    (
        "row ids past the last row",
        lambda kv: kv.row_sparse_pull(0, row_ids=np.array([0.0, 2.0, 7.0], np.float32)),
        IndexError,
        r"row_ids for key 0 out of range \[0, 2\): got 2.0",
    ),
    (
        "complex row ids",
        lambda kv: kv.row_sparse_pull(0, row_ids=np.array([1j])),
        TypeError,
        "must be real numbers, got complex128",
    ),
    ("empty device list", lambda kv: kv.push(0, []), ValueError, "empty list"),
    (
        "complex into real",
        lambda kv: kv.push(0, np.ones(SHAPE, np.complex64)),
        TypeError,
        "complex",
    ),
    (
        "read-only out",
        lambda kv: kv.pull(0, out=np.broadcast_to(np.zeros(3), SHAPE)),
        ValueError,
        "read-only",
    ),
    (
        "pushpull with a bad out pushes nothing",
        lambda kv: kv.pushpull(0, ones(), out=np.zeros(2)),
        ValueError,
        "out for key 0",
    ),
    (
        "broadcast with a bad out initialises nothing",
        lambda kv: kv.broadcast(9, ones(), out=np.zeros(2)),
        ValueError,
        "out for key 9",
    ),
]


@pytest.mark.parametrize("_, call, error, match", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_call_raises_clearly_and_changes_nothing(kv, _, call, error, match):
    before = snapshot(kv)
    with pytest.raises(error, match=match):
        call(kv)
    assert_unchanged(kv, before)
    assert kv.keys() == [0, 1]


def test_updater_that_raises_reaches_the_caller_and_no_key_changes(kv):
    def update(key, merged, stored):
        stored += merged  # changes its argument before failing
        if key == 1:
            raise RuntimeError("updater failed on key 1")

    kv.set_updater(update)
    before = snapshot(kv)
    with pytest.raises(RuntimeError, match="updater failed on key 1"):
        kv.push([0, 1], [ones(), ones()])
    assert_unchanged(kv, before)
    kv.push(0, ones())  # the store still works afterwards
    np.testing.assert_array_equal(kv.pull(0), before[0] + 1)


def test_store_never_aliases_pushed_or_initial_arrays(kv):
    initial = np.full(4, 2.0, np.float32)
    kv.init(10, initial)
    initial[:] = 99
    np.testing.assert_array_equal(kv.pull(10), [2, 2, 2, 2])
    pushed = np.full(4, 3.0, np.float32)
    kv.push(10, pushed)  # single array, no updater: MXNet keeps a reference here
    pushed[:] = 99
    np.testing.assert_array_equal(kv.pull(10), [3, 3, 3, 3])
    out = kv.pull(10)
    out[:] = 7
    np.testing.assert_array_equal(kv.pull(10), [3, 3, 3, 3])


def test_subscriber_that_raises_does_not_break_the_store(kv):
    kv.events.subscribe(lambda e: 1 / 0)
    with pytest.warns(RuntimeWarning, match="ZeroDivisionError"):
        kv.push(0, ones())
        np.testing.assert_array_equal(kv.pull(0), ones())


# -- property: any failing call leaves every key as it was -----------------------------

values = st.sampled_from(
    [
        np.ones(SHAPE, np.float32),
        np.ones((3, 2), np.float32),
        np.ones(SHAPE, np.float64),
        np.array(["x"] * 6).reshape(SHAPE),
        "not an array",
    ]
)
keys = st.sampled_from([0, 1, 2, "w", 1.5, None, True])
calls = st.tuples(
    st.sampled_from(["push", "pull", "init", "pushpull"]),
    st.lists(st.tuples(keys, st.lists(values, min_size=1, max_size=3)), min_size=1, max_size=3),
    st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(call=calls)
def test_a_call_either_succeeds_or_changes_nothing(call):
    op, pairs, with_updater = call
    kv = labkv.create("local")
    kv.init([0, 1], [np.zeros(SHAPE, np.float32), np.ones(SHAPE, np.float32)])
    if with_updater:

        def update(key, merged, stored):
            stored += merged
            if np.any(merged > 1.5):  # fails on some pushes, after touching its argument
                raise ArithmeticError("too big")

        kv.set_updater(update)
    before = snapshot(kv)
    key_arg = [k for k, _ in pairs]
    value_arg = [v for _, v in pairs]
    try:
        if op == "pull":
            kv.pull(key_arg, out=[[np.zeros(SHAPE)] * len(v) for v in value_arg])
        else:
            getattr(kv, op)(key_arg, value_arg)
    except (TypeError, ValueError, KeyError, ArithmeticError):
        assert_unchanged(kv, before)
