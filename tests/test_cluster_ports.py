"""MXNet-ported code on the cluster stores: MXNet's dist names, empty calls,
float row ids and any key name in optimizer-state files, as on the local store."""

from __future__ import annotations

import numpy as np
import pytest

import labkv
from labkv.cluster import run

SHAPE = (4, 2)


def _rank_pushes(kv):
    kv.init(0, np.zeros(2, np.float32))
    kv.push(0, np.full(2, kv.rank + 1.0, np.float32))
    kv.barrier()
    return kv.type, kv.pull(0)


@pytest.mark.parametrize("name, total", [("dist", 3.0), ("Dist_Sync_Device", 3.0)])
def test_mxnet_dist_names_make_sync_stores_and_keep_the_name(handle, name, total):
    out = run(_rank_pushes, num_workers=2, cluster=handle, kvstore=name)
    for kind, value in out:
        assert kind == name.lower()
        np.testing.assert_array_equal(value, [total, total])


def test_a_notebook_store_made_with_an_mxnet_name_reports_that_name(handle):
    with labkv.create("dist", cluster=handle, num_servers=1) as kv:
        assert kv.type == "dist" and "type='dist'" in repr(kv)
        kv.init(0, np.zeros(2, np.float32))
        kv.push(0, np.ones(2, np.float32))
        np.testing.assert_array_equal(kv.pull(0), [1, 1])
    with pytest.raises(ValueError, match="not a cluster store type: 'local_update_cpu'"):
        labkv.cluster.create_store("local_update_cpu", cluster=handle)


@pytest.fixture(params=["dist_sync", "dist_async", "dist_ssp"])
def kv(request, handle):
    extra = {"staleness": 1} if request.param == "dist_ssp" else {}
    store = labkv.create(request.param, cluster=handle, num_servers=2, bigarray_bound=4, **extra)
    store.init([0, 1], [np.zeros(SHAPE, np.float32), np.ones(2, np.float32)])
    yield store
    store.close()


def test_empty_calls_send_nothing_and_emit_no_event(kv):
    seen = []
    handle = kv.events.subscribe(seen.append)
    messages = [load["messages"] for load in kv.server_load()]
    kv.push([], [])
    assert kv.pull([], out=[]) is None and kv.pull([]) == []
    kv.pushpull([], [])
    kv.pushpull([], [], out=[])
    kv.init([], [])
    kv.broadcast([], [], out=[])
    assert kv.row_sparse_pull([], row_ids=[]) == []
    kv.barrier()  # flushes: nothing was held back to be sent later
    assert [load["messages"] for load in kv.server_load()] == messages
    handle.unsubscribe()
    assert [e for e in seen if e.op in ("push", "pull", "init")] == []
    assert kv.keys() == [0, 1]


def test_float_row_ids_of_a_sliced_key(kv):
    kv.push(0, np.arange(8.0, dtype=np.float32).reshape(SHAPE))
    assert len(kv.placement()[0]) == 2  # sliced across both servers
    out = kv.row_sparse_pull(0, row_ids=np.array([1, 3], np.float32))
    np.testing.assert_array_equal(out, [[0, 0], [2, 3], [0, 0], [6, 7]])
    with pytest.raises(ValueError, match="row_ids for key 0 must be whole numbers; got 1.5"):
        kv.row_sparse_pull(0, row_ids=np.array([1.5]))


def test_a_user_key_named_num_update_keeps_its_count_through_a_state_file(handle, tmp_path):
    keys = ["__num_update__", "other"]
    local = labkv.create()
    dist = labkv.create("dist_sync", cluster=handle, num_servers=2, bigarray_bound=4)
    try:
        for store in (local, dist):
            store.init(keys, [np.zeros(SHAPE, np.float32)] * 2)
            schedule = labkv.lr_scheduler.FactorScheduler(step=2, factor=0.5, base_lr=1.0)
            store.set_optimizer(
                labkv.optimizers.SGD(learning_rate=1.0, momentum=0.5, lr_scheduler=schedule)
            )
            for pushed in (keys[:1], keys[:1], keys):
                store.push(pushed, [np.ones(SHAPE, np.float32)] * len(pushed))
        dist.save_optimizer_states(tmp_path / "dist")
        dist.load_optimizer_states(tmp_path / "dist")
        for store in (local, dist):
            store.push(keys, [np.ones(SHAPE, np.float32)] * 2)
        for a, b in zip(local.pull(keys), dist.pull(keys)):
            np.testing.assert_array_equal(a, b)
        local.save_optimizer_states(tmp_path / "local")
        dist.save_optimizer_states(tmp_path / "dist")
        from labkv._optim import statefile

        assert statefile.load(tmp_path / "dist")[0] == statefile.load(tmp_path / "local")[0]
    finally:
        dist.close()
