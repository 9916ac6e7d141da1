"""Partitioning across ranks: disjoint, complete, equal steps; chunked shuffling."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkv.data import EpochOrder, MinibatchSource, plan_partition

sizes = st.integers(1, 300)
batches = st.integers(1, 12)
workers = st.integers(1, 7)


@settings(max_examples=150, deadline=None)
@given(n=sizes, b=batches, w=workers, drop=st.booleans())
def test_plan_gives_equal_disjoint_complete_parts(n, b, w, drop):
    if drop and n < w * b:
        with pytest.raises(ValueError, match="drop_last=True needs"):
            plan_partition(n, b, w, drop)
        return
    p = plan_partition(n, b, w, drop)
    assert p.steps == (n // (w * b) if drop else -(-n // (w * b)))
    real = Counter()
    for r in range(w):
        pos, pad = p.positions(r)
        assert len(pos) == p.steps * b  # equal steps, full minibatches
        assert ((pos >= 0) & (pos < n)).all()
        assert pad.sum() <= b
        if drop:
            assert not pad.any()
        real.update(pos[~pad].tolist())
        # segments() describe exactly the same positions
        seg = np.concatenate([np.arange(a, z) for a, z in p.segments(r)])
        assert np.array_equal(seg, pos)
    assert max(real.values()) == 1  # disjoint
    if drop:
        assert n - len(real) < w * b
    else:
        assert sorted(real) == list(range(n))  # complete


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 120),
    b=st.integers(1, 9),
    w=st.integers(1, 5),
    drop=st.booleans(),
    chunk=st.integers(1, 20),
    window=st.one_of(st.none(), st.integers(1, 4)),
    seed=st.integers(0, 3),
)
def test_sources_yield_equal_full_minibatches_covering_the_epoch(
    n, b, w, drop, chunk, window, seed
):
    if drop and n < w * b:
        return
    data = {"id": np.arange(n), "x": np.arange(n, dtype=np.float32)[:, None] * [1, -1]}
    srcs = [
        MinibatchSource(
            data,
            b,
            rank=r,
            num_workers=w,
            drop_last=drop,
            chunk_size=chunk,
            window=window,
            seed=seed,
            prefetch=0,
        )
        for r in range(w)
    ]
    real = Counter()
    per_rank = []
    for src in srcs:
        mbs = list(src)
        per_rank.append(len(mbs))
        assert len(mbs) == len(src)
        for mb in mbs:
            assert mb.num_samples == b
            assert np.array_equal(mb["id"], mb.indices)
            assert np.array_equal(mb["x"][:, 1], -mb.indices)
            real.update(mb.indices[~mb.padding].tolist())
    assert len(set(per_rank)) == 1
    assert max(real.values()) == 1
    if not drop:
        assert sorted(real) == list(range(n))
    # Each rank's real samples are its block of the epoch order, in order.
    order = srcs[0].order(0).ids(0, n)
    for r, src in enumerate(srcs):
        got = np.concatenate([mb.indices[~mb.padding] for mb in src.iter_epoch(0)])
        start, _ = src.partition.block(r)
        assert np.array_equal(got, order[start : start + len(got)])


def test_empty_and_too_small_sources_fail_loudly():
    with pytest.raises(ValueError, match="no samples"):
        MinibatchSource({"x": np.zeros((0, 3))}, 4)
    with pytest.raises(ValueError, match="drop_last=True needs"):
        MinibatchSource({"x": np.zeros(5)}, 4, num_workers=2, drop_last=True)
    with pytest.raises(ValueError, match="rank must be"):
        MinibatchSource({"x": np.zeros(5)}, 4, rank=2, num_workers=2)


@settings(max_examples=40, deadline=None)
@given(
    chunks=st.lists(st.integers(1, 15), min_size=1, max_size=12),
    window=st.integers(1, 5),
    seed=st.integers(0, 100),
)
def test_epoch_order_is_a_windowed_permutation(chunks, window, seed):
    o = EpochOrder(chunks, window=window, seed=seed, epoch=0)
    n = sum(chunks)
    ids = o.ids(0, n)
    assert sorted(ids.tolist()) == list(range(n))
    starts = np.concatenate([[0], np.cumsum(chunks)])
    chunk_of = np.searchsorted(starts, ids, side="right") - 1
    # Each window of positions draws on at most `window` chunks.
    for w in range(len(o.windows)):
        lo, hi = o.window_starts[w], o.window_starts[w + 1]
        assert len(set(chunk_of[lo:hi].tolist())) <= window
    # Any sub-range equals the slice of the whole.
    a, b = n // 3, n - n // 4
    assert np.array_equal(o.ids(a, b), ids[a:b])


def test_order_is_deterministic_per_seed_and_epoch_and_differs_across_epochs():
    sizes = [50] * 8

    def ids(seed, epoch):
        return EpochOrder(sizes, window=3, seed=seed, epoch=epoch).ids(0, 400)

    assert np.array_equal(ids(1, 0), ids(1, 0))
    assert not np.array_equal(ids(1, 0), ids(1, 1))
    assert not np.array_equal(ids(1, 0), ids(2, 0))
    assert np.array_equal(EpochOrder(sizes, 3, shuffle=False).ids(0, 400), np.arange(400))


def test_for_loops_walk_through_epochs_deterministically():
    data = {"y": np.arange(40)}

    def run():
        src = MinibatchSource(data, 8, seed=5, chunk_size=4, window=2, prefetch=0)
        return [np.concatenate([mb["y"] for mb in src]).tolist() for _ in range(3)]

    a, b = run(), run()
    assert a == b
    assert a[0] != a[1] != a[2]
    assert all(sorted(e) == list(range(40)) for e in a)


def test_rank_and_workers_come_from_a_store():
    kv = SimpleNamespace(rank=2, num_workers=3)
    src = MinibatchSource.for_store(kv, {"y": np.arange(30)}, batch_size=4)
    assert (src.rank, src.num_workers, len(src)) == (2, 3, 3)
    with pytest.raises(ValueError, match="not both"):
        MinibatchSource({"y": np.arange(30)}, store=kv, rank=0)


def test_for_store_with_a_local_kvstore():
    labkv = pytest.importorskip("labkv")
    if not hasattr(labkv, "create"):
        pytest.skip("labkv.create is not there yet")
    src = MinibatchSource.for_store(labkv.create("local"), {"y": np.arange(10)}, batch_size=3)
    assert (src.rank, src.num_workers, len(src)) == (0, 1, 4)
