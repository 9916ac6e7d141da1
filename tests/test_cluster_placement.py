"""Placement: MXNet's server rule, str keys numbered in init order, slices of
big values (no cluster)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from labkv.cluster import key_id, place
from labkv.cluster._placement import KeyIds, Piece


def test_small_int_key_goes_to_mxnet_server():
    assert place(5, 10, num_servers=3) == [Piece((5 * 9973) % 3, 0, 10)]
    assert key_id(5) == 5


def test_str_key_id_is_its_position_in_init_order():
    order = ["W1", "b1", "W2", "b2", "W3", "b3"]
    assert [key_id(k, order) for k in order] == [0, 1, 2, 3, 4, 5]
    assert [place(key_id(k, order), 4, 2)[0].server for k in order] == [0, 1, 0, 1, 0, 1]
    assert place(key_id("b1", order), 4, 4)[0].server == (1 * 9973) % 4
    with pytest.raises(KeyError, match="'x' is not in the init order"):
        key_id("x", order)


def test_place_takes_an_id_not_a_str_key():
    with pytest.raises(TypeError, match="integer id"):
        place("w", 4, 2)


def test_key_ids_number_in_order_and_after_an_adopted_id():
    ids = KeyIds()
    assert ids.proposed(["a", "b"]) == [0, 1]
    assert ids.proposed(["a", "b"]) == [0, 1]  # proposing assigns nothing
    ids.assign(["a", "b"])
    assert (ids["a"], ids["b"]) == (0, 1)
    ids.adopt("z", 7)  # a key this process learned: the owner's id
    assert ids["z"] == 7 and ids.proposed(["c"]) == [8]
    ids.adopt("y", 2)  # an earlier id does not turn the numbering back
    assert ids.proposed(["c"]) == [8]
    assert KeyIds().proposed([3, 9]) == [3, 9]  # int keys are their own ids


def test_value_at_bound_is_sliced_below_bound_is_not():
    assert len(place(0, 99, 2, bigarray_bound=100)) == 1
    assert place(0, 100, 2, bigarray_bound=100) == [Piece(0, 0, 50), Piece(1, 50, 100)]
    assert place(1, 100, 2, bigarray_bound=100) == place(0, 100, 2, bigarray_bound=100)


def test_one_server_never_slices():
    assert place(0, 10**7, 1) == [Piece(0, 0, 10**7)]


@given(st.integers(1, 10**7), st.integers(1, 9), st.integers(1, 10**6))
def test_slices_cover_the_value_once_in_order(size, servers, bound):
    pieces = place(7, size, servers, bigarray_bound=bound)
    assert pieces[0].start == 0 and pieces[-1].stop == size
    assert all(a.stop == b.start for a, b in zip(pieces, pieces[1:]))
    if len(pieces) > 1:
        assert [p.server for p in pieces] == list(range(servers))
