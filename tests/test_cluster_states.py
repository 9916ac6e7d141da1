"""Optimizers and updaters on the servers; optimizer states saved and loaded
across all servers, in the local store's file format."""

from __future__ import annotations

import numpy as np

import labkv
from labkv._optim import statefile
from labkv.cluster import run


def _train(kv, path_save, steps):
    kv.init(["w", "b"], [np.zeros(12, dtype=np.float32), np.zeros(3, dtype=np.float32)])
    kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.1, momentum=0.9))
    for step in range(steps):
        kv.push(["w", "b"], [np.arange(12, dtype=np.float32) * (step + 1), np.ones(3, np.float32)])
    if path_save is not None:
        kv.save_optimizer_states(path_save, dump_optimizer=True)
    return kv.pull(["w", "b"])


def test_states_from_all_servers_match_the_local_file(handle, tmp_path):
    local = labkv.create("local")
    local_values = _train(local, tmp_path / "local", 3)
    # bigarray_bound=10: "w" (12 elements) is sliced across both servers
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2, bigarray_bound=10)
    try:
        dist_values = _train(kv, tmp_path / "dist", 3)
        assert len(kv.placement()["w"]) == 2
        for a, b in zip(local_values, dist_values):
            np.testing.assert_array_equal(a, b)
        meta_l, arrays_l = statefile.load(tmp_path / "local")
        meta_d, arrays_d = statefile.load(tmp_path / "dist")
        key_order = [e["key"] for e in meta_l["keys"]]
        assert sorted(map(str, key_order)) == sorted(str(e["key"]) for e in meta_d["keys"])
        assert meta_d["num_update"] == meta_l["num_update"] == 3
        assert meta_d["optimizer"] == meta_l["optimizer"]
        by_key_l = {str(e["key"]): arrays_l[f"s{i}_0"] for i, e in enumerate(meta_l["keys"])}
        by_key_d = {str(e["key"]): arrays_d[f"s{i}_0"] for i, e in enumerate(meta_d["keys"])}
        for k in by_key_l:
            np.testing.assert_array_equal(by_key_l[k], by_key_d[k])

        # load the local file into the cluster store: both continue identically
        kv.load_optimizer_states(tmp_path / "local")
        for store in (local, kv):
            store.push(["w", "b"], [np.ones(12, np.float32), np.ones(3, np.float32)])
        for a, b in zip(local.pull(["w", "b"]), kv.pull(["w", "b"])):
            np.testing.assert_array_equal(a, b)
    finally:
        kv.close()


def _rank_saves(kv, path):
    kv.init(0, np.zeros(2, dtype=np.float32))
    if kv.rank == 0:
        kv.set_optimizer(labkv.optimizers.Adam(learning_rate=0.1))
    kv.barrier()
    kv.push(0, np.ones(2, dtype=np.float32))
    kv.pull(0)
    kv.barrier()
    if kv.rank == 0:
        kv.save_optimizer_states(path)
        kv.load_optimizer_states(path)
    return kv.pull(0)


def test_a_rank_saves_and_loads_the_servers_states(handle, tmp_path):
    path = tmp_path / "adam"
    a, b = run(_rank_saves, num_workers=2, cluster=handle, args=(str(path),))
    np.testing.assert_array_equal(a, b)
    meta, arrays = statefile.load(path)
    assert meta["keys"][0]["n"] == 2  # Adam: mean and variance
    np.testing.assert_array_equal(arrays["s0_0"].shape, (2,))


def test_custom_updater_ships_by_pickle(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2)
    try:
        kv.init(["a", "b"], [np.ones(2), np.ones(2)])
        scale = 3.0

        def update(key, merged, stored):  # a closure: travels by value
            stored += merged * scale

        kv.set_updater(update)
        kv.push(["a", "b"], [np.ones(2), np.full(2, 2.0)])
        np.testing.assert_array_equal(kv.pull("a"), [4.0, 4.0])
        np.testing.assert_array_equal(kv.pull("b"), [7.0, 7.0])
    finally:
        kv.close()
