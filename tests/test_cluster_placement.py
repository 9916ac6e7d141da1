"""Placement: MXNet's server rule, stable str ids, slices of big values (no cluster)."""

from __future__ import annotations

import zlib

from hypothesis import given
from hypothesis import strategies as st

from labkv.cluster import key_id, place
from labkv.cluster._placement import Piece


def test_small_int_key_goes_to_mxnet_server():
    assert place(5, 10, num_servers=3) == [Piece((5 * 9973) % 3, 0, 10)]


def test_str_key_id_is_crc32_and_stable():
    assert key_id("weight") == zlib.crc32(b"weight")
    assert place("weight", 4, 4)[0].server == (zlib.crc32(b"weight") * 9973) % 4


def test_value_at_bound_is_sliced_below_bound_is_not():
    assert len(place(0, 99, 2, bigarray_bound=100)) == 1
    assert place(0, 100, 2, bigarray_bound=100) == [Piece(0, 0, 50), Piece(1, 50, 100)]


def test_one_server_never_slices():
    assert place(0, 10**7, 1) == [Piece(0, 0, 10**7)]


@given(st.integers(1, 10**7), st.integers(1, 9), st.integers(1, 10**6))
def test_slices_cover_the_value_once_in_order(size, servers, bound):
    pieces = place(7, size, servers, bigarray_bound=bound)
    assert pieces[0].start == 0 and pieces[-1].stop == size
    assert all(a.stop == b.start for a, b in zip(pieces, pieces[1:]))
    if len(pieces) > 1:
        assert [p.server for p in pieces] == list(range(servers))
