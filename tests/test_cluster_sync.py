"""dist_sync and dist_async with W = 2 ranks on a real 2-process LocalCluster."""

from __future__ import annotations

import numpy as np
import pytest

import labkv
from labkv.cluster import run

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _sum_ranks(kv):
    kv.init(3, np.zeros((2, 3), dtype=np.float32))
    kv.push(3, np.full((2, 3), kv.rank + 1, dtype=np.float32))
    return kv.rank, kv.num_workers, kv.pull(3)


def test_dist_sync_sums_the_ranks_pushes(handle):
    results = run(_sum_ranks, num_workers=2, cluster=handle)
    assert [(r, w) for r, w, _ in results] == [(0, 2), (1, 2)]
    for _, _, value in results:
        np.testing.assert_array_equal(value, np.full((2, 3), 3, dtype=np.float32))


def _sgd(kv):
    kv.init(0, np.zeros(4, dtype=np.float32))
    kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.5))
    kv.push(0, np.ones(4, dtype=np.float32))
    return kv.pull(0)


def test_optimizer_on_the_server_gets_the_sum_of_gradients(handle):
    for value in run(_sgd, num_workers=2, cluster=handle):
        np.testing.assert_array_equal(value, np.full(4, -1, dtype=np.float32))  # as MXNet


def _big(kv):
    kv.init("w", np.zeros((4, 5), dtype=np.float32))
    kv.push("w", np.arange(20, dtype=np.float32).reshape(4, 5) * (kv.rank + 1))
    return kv.pull("w"), kv.placement()


def test_big_values_are_sliced_across_servers_and_reassembled(handle):
    results = run(_big, num_workers=2, num_servers=2, cluster=handle, bigarray_bound=10)
    for value, placement in results:
        np.testing.assert_array_equal(value, np.arange(20, dtype=np.float32).reshape(4, 5) * 3)
        assert [(p["server"], p["start"], p["stop"]) for p in placement["w"]] == [
            (0, 0, 10),
            (1, 10, 20),
        ]
    devices = {p["device"] for p in results[0][1]["w"]}
    assert len(devices) == 2  # two servers on the two Dask workers


def _many_keys(kv, rounds):
    keys = [f"k{i}" for i in range(6)]
    kv.init(keys, [np.zeros(3) for _ in keys])
    for _ in range(rounds):
        kv.push(keys, [np.full(3, i + kv.rank) for i in range(len(keys))])
    outs = [np.empty(3) for _ in keys]
    kv.pull(keys, out=outs)
    return outs


def test_lists_of_str_keys_take_one_message_per_server(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2)
    try:
        kv.init([f"k{i}" for i in range(6)], [np.zeros(3) for _ in range(6)])  # the owner inits
        before = [load["messages"]["push"] for load in kv.server_load()]
        results = run(_many_keys, num_workers=2, kvstore=kv, args=(5,))
        after = [load["messages"]["push"] for load in kv.server_load()]
    finally:
        kv.close()
    for outs in results:  # ASSIGN: each round stores the sum of the two ranks' pushes
        for i, out in enumerate(outs):
            np.testing.assert_array_equal(out, np.full(3, 2 * i + 1.0))
    # 6 keys on 2 servers, 2 ranks x 5 pushes: one message per server per push call
    assert sum(a - b for a, b in zip(after, before)) == 2 * 5 * 2


def test_ranks_share_the_notebook_store(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2)
    try:
        assert (kv.rank, kv.num_workers) == (0, 1)
        kv.init(["a", "b"], [np.zeros(2), np.ones(2)])
        results = run(_sum_ranks_str, num_workers=2, kvstore=kv)
        for value in results:
            np.testing.assert_array_equal(value, [3.0, 3.0])
        np.testing.assert_array_equal(kv.pull("a"), [3.0, 3.0])  # the notebook watches
        kv.push("b", np.full(2, 7.0))  # back to a 1-worker store after the run
        np.testing.assert_array_equal(kv.pull("b"), [7.0, 7.0])
    finally:
        kv.close()


def _sum_ranks_str(kv):
    kv.init("a", np.zeros(2))  # waits for the notebook's init: it owns the keys
    kv.push("a", np.full(2, kv.rank + 1.0))
    return kv.pull("a")


def _async(kv):
    kv.init(0, np.zeros(2))
    kv.push(0, np.full(2, 10.0 * (kv.rank + 1)))
    kv.barrier()
    return kv.pull(0)


def test_dist_async_applies_each_push(handle):
    results = run(_async, num_workers=2, kvstore="dist_async", cluster=handle)
    # no updater: ASSIGN, each push replaces the value; after the barrier both
    # ranks see the same last push, whichever rank's it was.
    np.testing.assert_array_equal(results[0], results[1])
    assert results[0][0] in (10.0, 20.0)


def _async_sgd(kv):
    kv.init(0, np.zeros(2, dtype=np.float32))
    if kv.rank == 0:
        kv.set_optimizer(labkv.optimizers.SGD(learning_rate=1.0))
    kv.barrier()
    for _ in range(5):
        kv.push(0, np.ones(2, dtype=np.float32))
    kv.barrier()
    return kv.pull(0)


def test_dist_async_applies_every_push_with_an_optimizer(handle):
    results = run(_async_sgd, num_workers=2, kvstore="dist_async", cluster=handle)
    for value in results:  # 2 ranks x 5 pushes, each applied at once
        np.testing.assert_array_equal(value, np.full(2, -10, dtype=np.float32))


def _tutorial(kv, devs):
    """The MXNet KVStore tutorial's steps (labkv.tour), on the given store."""
    shape = (2, 3)
    got = []
    kv.init(3, labkv.ones(shape) * 2)
    a = labkv.zeros(shape)
    kv.pull(3, out=a)
    got.append(float(a[0, 0]))
    kv.push(3, labkv.ones(shape) * 8)
    kv.pull(3, out=a)
    got.append(float(a[0, 0]))
    kv.push(3, [labkv.ones(shape, device=d) for d in devs])
    kv.pull(3, out=a)
    got.append(float(a[0, 0]))

    def update(key, merged, stored):
        stored += merged * 2

    kv.set_updater(update)
    kv.pull(3, out=a)
    got.append(float(a[0, 0]))
    kv.push(3, labkv.ones(shape))
    kv.pull(3, out=a)
    got.append(float(a[0, 0]))
    b = [labkv.ones(shape, device=d) for d in devs]
    kv.pull(3, out=b)
    got.append(float(b[1][0, 0]))
    keys = [5, 7, 9]
    kv.init(keys, [labkv.ones(shape)] * len(keys))
    kv.push(keys, [labkv.ones(shape)] * len(keys))
    b = [labkv.zeros(shape) for _ in keys]
    kv.pull(keys, out=b)
    got.append(float(b[1][0, 0]))
    kv.push(keys, [[labkv.ones(shape, device=d) for d in devs] for _ in keys])
    c = [[labkv.zeros(shape, device=d) for d in devs] for _ in keys]
    kv.pull(keys, out=c)
    got.append(float(c[1][1][0, 0]))
    return got


def test_mxnet_tutorial_gives_the_local_numbers_on_dist_sync(handle):
    devs = labkv.devices(4)
    local = _tutorial(labkv.create("local"), devs)
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2)
    try:
        dist = _tutorial(kv, devs)
    finally:
        kv.close()
    assert local == [2, 8, 4, 4, 6, 6, 3, 11]
    assert dist == local


def test_tutorial_as_one_rank_of_run(handle):
    [got] = run(_tutorial, num_workers=1, cluster=handle, args=(labkv.devices(4),))
    assert got == [2, 8, 4, 4, 6, 6, 3, 11]


def test_pull_of_a_rank_that_has_not_pushed_gets_the_last_completed_value(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=1)
    try:
        kv.init(1, np.zeros(2))
        kv.push(1, np.ones(2))
        results = run(_pull_only, num_workers=2, kvstore=kv)
        for value in results:
            np.testing.assert_array_equal(value, [1.0, 1.0])
    finally:
        kv.close()


def _pull_only(kv):
    return kv.pull(1)
