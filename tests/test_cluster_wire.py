"""The messages between ranks and servers (``labkv.cluster._protocol.messages``), without Dask."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from labkv.cluster._protocol.messages import (
    Codes,
    Pull,
    Push,
    PushHeader,
    Values,
    decode_pull,
    decode_push,
    decode_values,
    encode,
    pack_values,
    piece_specs,
    push_items,
    values_items,
)
from labkv.cluster._protocol.packing import PACK_BELOW, pack
from labkv.cluster._rank.split import push_message

STORED = {
    "a": (np.dtype("f4"), (2, 3)),
    "b": (np.dtype("i8"), (4,)),
    "big": (np.dtype("f8"), (1 << 14,)),
}


def _travel(msg):
    """What the server gets: the encoded message through pickle, as Dask sends it."""
    return pickle.loads(pickle.dumps(encode(msg), protocol=5))


def _push(copy=False):
    batch = [
        ("a", np.arange(6, dtype="f4").reshape(2, 3)),
        ("big", np.arange(1 << 14, dtype="f8")),
        ("b", np.array([1, 2, 3, 4], dtype="i8")),
    ]
    meta = {k: (shape, dtype) for k, (dtype, shape) in STORED.items()}
    return batch, push_message(("sender-1", 3, 17), batch, meta, copy, same_process=False)


def test_every_push_field_lands_where_it_should():
    batch, push = _push()
    got = decode_push(_travel(push))
    assert got.header == PushHeader("sender-1", 3, 17, ["a", "big", "b"], None, [1], False, None)
    items = push_items(got, STORED.get)
    assert [k for k, _ in items] == ["a", "big", "b"]
    for (_, want), (_, value) in zip(batch, items, strict=True):
        np.testing.assert_array_equal(value, want)
        assert value.dtype == want.dtype and value.shape == want.shape


def test_a_push_not_waited_for_copies_its_big_values():
    batch, push = _push(copy=True)
    assert push.bigs[0] is not batch[1][1]
    np.testing.assert_array_equal(push.bigs[0], batch[1][1])
    _, lent = _push(copy=False)
    assert lent.header.borrowed is False  # lent only to a server in this process


def test_a_push_of_another_dtype_says_so_and_is_read_with_it():
    meta = {"a": ((2, 3), np.dtype("f4"))}
    value = np.ones((2, 3), dtype="f8")
    push = push_message(("s", 0, 0), [("a", value)], meta, copy=True, same_process=False)
    assert push.header.dtypes == ["<f8"]
    ((_, got),) = push_items(decode_push(_travel(push)), STORED.get)
    assert got.dtype == np.float64


def test_a_small_message_travels_as_one_frame_and_a_big_one_as_a_tuple():
    _, push = _push()
    assert isinstance(encode(push), tuple)  # the big array is its own frame
    small = Push(PushHeader("s", 0, 1, ["a"], None, [], False, None), pack([np.zeros(6, "f4")]), [])
    assert isinstance(encode(small), bytes)


def test_a_pull_and_its_reply_round_trip():
    pull = Pull("sender-1", 5, ["a", "big"], None, None, None, (b"held push",))
    assert decode_pull(_travel(pull)) == pull
    values = [np.ones((2, 3), "f4"), np.arange(1 << 14, dtype="f8")]
    reply = decode_values(_travel(pack_values(values)))
    assert reply.big == [1]
    got = values_items(["a", "big"], reply, STORED.get)
    for want, (_, value) in zip(values, got, strict=True):
        np.testing.assert_array_equal(value, want)


def test_compressed_values_are_read_as_codes():
    codes = Codes("2bit", 0.5, {"b": 2})
    assert piece_specs(["b"], STORED.get, codes=codes) == [(np.uint8, (2, 1))]


@pytest.mark.parametrize(
    ("decode", "msg"),
    [
        (decode_pull, ("sender", 1, ["a"])),  # a field short
        (decode_values, ([], None, [], "extra")),
        (decode_push, (("s", 0, 1, ["a"], None, [], False), None, [])),  # header without codes
    ],
)
def test_a_message_of_the_wrong_shape_fails_loudly(decode, msg):
    with pytest.raises(TypeError, match="message has"):
        decode(msg)


def test_a_packed_buffer_that_does_not_match_the_stored_shapes_fails():
    push = Push(PushHeader("s", 0, 0, ["a"], None, [], False, None), pack([np.zeros(5, "f4")]), [])
    with pytest.raises(ValueError, match="layout needs"):
        push_items(decode_push(_travel(push)), STORED.get)


def test_values_at_the_pack_bound_travel_on_their_own():
    at = np.zeros(PACK_BELOW, np.uint8)
    below = np.zeros(PACK_BELOW - 1, np.uint8)
    v = pack_values([below, at])
    assert v.big == [1] and v.bigs[0] is at and v.packed.nbytes == below.nbytes
    assert isinstance(v, Values)
