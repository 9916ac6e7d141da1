"""Packed messages, in-process calls to a rank's own server, and tallied server events."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import labkv
from labkv.cluster import run
from labkv.cluster._protocol.packing import ALIGN, PACK_BELOW, layout, pack, unpack

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

_MIXED = [
    np.arange(7, dtype=np.float16),
    np.array(3.5),  # 0-d
    np.arange(15, dtype=np.int8).reshape(3, 5),
    np.zeros((0, 4), dtype=np.float32),  # empty
    np.array([1 + 2j, -3j], dtype=np.complex128),
    np.array([True, False, True]),
    np.arange(6, dtype=np.uint64).reshape(2, 1, 3),
    np.linspace(0, 1, 33, dtype=np.float32),
]


def test_pack_round_trips_mixed_dtypes_and_shapes():
    buf = pack(_MIXED)
    assert buf.dtype == np.uint8 and buf.ndim == 1
    views = unpack(buf, [(a.dtype, a.shape) for a in _MIXED])
    for a, v in zip(_MIXED, views, strict=True):
        assert v.dtype == a.dtype and v.shape == a.shape
        np.testing.assert_array_equal(v, a)
    offsets, total = layout([a.nbytes for a in _MIXED])
    assert total == buf.nbytes and all(off % ALIGN == 0 for off in offsets)


def test_pack_of_a_view_round_trips():
    # Callers pass C-contiguous arrays (DistStore makes them so), e.g. slices of a flat value.
    a = np.arange(12, dtype=np.float64)
    (v,) = unpack(pack([a[3:9]]), [(a.dtype, (6,))])
    np.testing.assert_array_equal(v, a[3:9])


def test_unpack_checks_the_buffer_size():
    buf = pack([np.ones(3, dtype=np.float32)])
    with pytest.raises(ValueError, match="layout needs"):
        unpack(buf, [(np.float32, (4,))])


def _mixed_rank(kv, values, big_key):
    keys = list(range(len(values)))
    kv.init(keys, [np.zeros_like(v) for v in values])
    # Values pushed in another dtype than stored (float64 into float32 and int8):
    # the servers sum them as the local store does.
    kv.push(keys, [(v * (kv.rank + 1)).astype(np.float64) for v in values])
    small = kv.pull(keys)
    # A big value (its own frame), in a list with small ones, in one message per server.
    kv.init(big_key, np.zeros(PACK_BELOW, dtype=np.float32))
    kv.push([big_key, 0], [np.full(PACK_BELOW, kv.rank + 1.0, np.float32), values[0]])
    outs = [np.empty(PACK_BELOW, np.float64), np.empty_like(values[0])]
    kv.pull([big_key, 0], out=outs)
    return small, outs


@pytest.mark.parametrize("servers", [1, 2])
def test_small_and_big_values_of_mixed_dtypes_survive_push_and_pull(handle, servers):
    values = [
        np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
        np.arange(5, dtype=np.int8),
        np.array(2.5, dtype=np.float64),
        np.zeros((0, 3), dtype=np.float32),
        np.arange(40, dtype=np.float32),  # sliced over 2 servers (bigarray_bound 30)
    ]
    results = run(
        _mixed_rank,
        num_workers=2,
        num_servers=servers,
        cluster=handle,
        args=(values, 99),
        bigarray_bound=30,
    )
    local = labkv.create("local")
    keys = list(range(len(values)))
    local.init(keys, [np.zeros_like(v) for v in values])
    local.push(keys, [[(v * (r + 1)).astype(np.float64) for r in range(2)] for v in values])
    expected = local.pull(keys)
    for small, (big, first) in results:
        for got, want in zip(small, expected, strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(big, np.full(PACK_BELOW, 3.0))
        np.testing.assert_array_equal(first, values[0] * 2)


def _reuse_the_buffer(kv, n):
    kv.init("w", np.zeros(n, dtype=np.float32))
    grad = np.full(n, kv.rank + 1.0, dtype=np.float32)
    if kv.rank == 1:
        time.sleep(0.5)  # rank 0's push (to its own worker's server) is the round's first
    kv.push("w", grad)  # >= 1 MiB: waited for, sent without a copy
    grad[:] = -100.0  # the caller may reuse its buffer as soon as push returns
    return kv.pull("w")[:3], kv._local_server(0) is not None


def test_a_rank_may_reuse_its_buffer_after_pushing_to_its_own_workers_server(handle):
    n = 1 << 19  # 2 MiB of float32
    results = run(_reuse_the_buffer, num_workers=2, num_servers=1, cluster=handle, args=(n,))
    assert [local for _, local in results] == [True, False]  # rank 0 called in-process
    for value, _ in results:
        np.testing.assert_array_equal(value, [3.0, 3.0, 3.0])


def _push_last_and_reuse(kv, n):
    kv.init("w", np.zeros(n, dtype=np.float32))
    grad = np.full(n, kv.rank + 1.0, dtype=np.float32)
    if kv.rank == 0:
        time.sleep(0.5)  # rank 1's push arrives first: rank 0's completes the round
    kv.push("w", grad)
    grad[:] = -100.0
    server = kv._local_server(0)
    staged = None if server is None else sorted(server.staging.buffers)
    return kv.pull("w")[:3], staged


def test_a_push_that_completes_its_round_is_summed_without_a_staging_copy(handle):
    n = 1 << 19  # 2 MiB of float32
    results = run(_push_last_and_reuse, num_workers=2, num_servers=1, cluster=handle, args=(n,))
    assert [staged for _, staged in results] == [[], None]  # rank 0's value was not copied
    for value, _ in results:
        np.testing.assert_array_equal(value, [3.0, 3.0, 3.0])


def _push_many(kv, n):
    for _ in range(n):
        kv.push("w", np.ones(16, dtype=np.float32))
    return kv.pull("w")


def test_throttled_server_receipts_keep_exact_counts_and_count_slices_once(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2, bigarray_bound=8)
    events, lock = [], threading.Lock()

    def record(event):
        with lock:
            events.append(event)

    try:
        kv.init("w", np.zeros(16, dtype=np.float32))
        # One detailed event per op and server a minute: the rest are only counted
        # on the servers and arrive as count-carrying events at their next flush.
        sub = kv.events.subscribe(record, detail_interval=60, detail_burst=1)
        run(_push_many, num_workers=2, kvstore=kv, args=(20,))

        def receipts():
            with lock:
                return [e for e in events if e.op == "push" and e.server is not None]

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            counted = sum(e.count for e in receipts() if e.first_piece)
            if counted >= 40:
                break
            time.sleep(0.05)
        time.sleep(0.3)  # a later batch must not add to the counts
        got = receipts()
        sub.unsubscribe()
    finally:
        kv.close()
    first = [e for e in got if e.first_piece]
    assert sum(e.count for e in first) == 40  # 2 ranks x 20 pushes, each counted once
    assert sum(e.count for e in got) == 80  # both slices' servers saw every push
    assert any(e.tally for e in got)  # most were only counted
    detailed = [e for e in got if not e.tally]
    # one a minute per op and server: a stream's budget (burst 1 x op_budget 1)
    assert len(detailed) == 2 and all(e.summary is not None for e in detailed)
    assert {e.server for e in detailed} == {0, 1}
