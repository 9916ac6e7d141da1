"""Code and tests written for MXNet 1.9.1's KVStore run unchanged: its store
names, empty calls, float row ids, any key name in optimizer-state files, and
the one multi-device quirk labkv deliberately does not copy."""

from __future__ import annotations

import numpy as np
import pytest

import labkv
from labkv._types import STORE_TYPES
from tests._reference import reference

SHAPE = (2, 3)
LOCAL_NAMES = [name for name, kind in STORE_TYPES.items() if kind in ("local", "device")]


def quirk(name: str) -> str:
    return reference()["quirks"][name]


@pytest.mark.parametrize("name", LOCAL_NAMES)
def test_every_local_name_mxnet_accepts_makes_its_store_and_keeps_the_name(name):
    if name != "nccl":  # MXNet's CPU build refuses it (USE_NCCL=1 builds accept it)
        assert f"{name}: ok type={name!r}" in quirk("create_types")
    kv = labkv.create(name)
    assert kv.type == name
    kv.init(0, np.zeros(SHAPE, np.float32))
    kv.push(0, [labkv.ones(SHAPE, device=d) for d in labkv.devices(2)])
    np.testing.assert_array_equal(kv.pull(0), np.full(SHAPE, 2.0))


def test_mxnet_names_are_case_insensitive_and_kept_lower_case_as_mxnet_does():
    assert "LOCAL: ok type='local'" in quirk("create_types")
    assert labkv.create("Local_AllReduce_Device").type == "local_allreduce_device"


@pytest.mark.parametrize(
    "name", ["nonsense", "localx", "my_device", "dist_sync_foo", "dist_device_async", ""]
)
def test_names_outside_the_table_are_refused_though_mxnet_reads_them_by_parts(name):
    # MXNet makes a store of any name (docs/mxnet_differences.md): a typo is refused here.
    with pytest.raises(ValueError, match="unknown KVStore type"):
        labkv.create(name)


@pytest.mark.parametrize(
    "name, owner", [("horovod", "Horovod"), ("byteps", "BytePS"), ("teststore", "MXNet's tests")]
)
def test_stores_of_other_libraries_are_refused_by_name(name, owner):
    with pytest.raises(ValueError, match=f"{owner}'s store, which labkv does not provide"):
        labkv.create(name)


def test_dist_names_take_no_local_arguments_and_local_names_refuse_dist_ones():
    with pytest.raises(TypeError, match="unexpected arguments for a 'local' store"):
        labkv.create("local_update_cpu", num_servers=2)


# -- empty calls ----------------------------------------------------------------------


@pytest.fixture(params=["local", "device"])
def kv(request):
    store = labkv.create(request.param)
    store.init([0, 1], [np.zeros(SHAPE, np.float32), np.ones(SHAPE, np.float32)])
    return store


def test_empty_calls_do_nothing_and_emit_no_event(kv):
    assert "nothing happens: init, push, pull, pushpull" in quirk("empty_calls")
    seen = []
    kv.events.subscribe(seen.append)
    kv.push([], [])
    assert kv.pull([], out=[]) is None
    assert kv.pull([]) == []
    kv.pushpull([], [])
    kv.pushpull([], [], out=[])
    kv.init([], [])
    kv.broadcast([], [], out=[])
    assert kv.row_sparse_pull([], row_ids=[]) == []
    assert seen == []
    assert kv.keys() == [0, 1]
    np.testing.assert_array_equal(kv.pull(1), np.ones(SHAPE))


def test_an_empty_init_does_not_fix_the_kind_of_key():
    kv = labkv.create()
    kv.init([], [])
    kv.init("w", np.zeros(2))
    assert kv.keys() == ["w"]


def test_an_empty_call_with_values_is_still_a_length_mismatch(kv):
    with pytest.raises(labkv.LengthMismatchError, match="0 keys but 1 values"):
        kv.push([], [np.ones(SHAPE)])


# -- row ids ----------------------------------------------------------------------------


def test_float_row_ids_holding_whole_numbers_pull_those_rows(kv):
    mxnet = quirk("float_row_ids")
    assert "row_ids of dtype float32 -> [[0.0, 0.0], [2.0, 3.0], [0.0, 0.0], [6.0, 7.0]]" in mxnet
    kv.init(5, np.arange(8.0, dtype=np.float32).reshape(4, 2))
    out = np.full((4, 2), -1.0, np.float32)
    kv.row_sparse_pull(5, out=out, row_ids=np.array([1, 3], np.float32))
    np.testing.assert_array_equal(out, [[0, 0], [2, 3], [0, 0], [6, 7]])
    as_ints = kv.row_sparse_pull(5, row_ids=np.array([1, 3]))
    np.testing.assert_array_equal(kv.row_sparse_pull(5, row_ids=np.array([1.0, 3.0])), as_ints)


@pytest.mark.parametrize(
    "row_ids, error, match",
    [
        (np.array([1.0, 2.5, 0.25], np.float32), ValueError, "whole numbers; got 2.5"),
        (np.array([0.0, np.nan]), ValueError, "whole numbers; got nan"),
        (np.array([0.0, np.inf]), ValueError, "whole numbers; got inf"),
        (np.array([3.0, 4.0, 9.0]), IndexError, r"out of range \[0, 4\): got 4.0"),
        (np.array([-1, 2]), IndexError, r"out of range \[0, 4\): got -1"),
        (np.array([True]), TypeError, "real numbers, got bool"),
    ],
)
def test_bad_row_ids_name_the_key_and_the_first_bad_id_and_write_nothing(kv, row_ids, error, match):
    kv.init(5, np.arange(8.0, dtype=np.float32).reshape(4, 2))
    out = np.full((4, 2), -1.0, np.float32)
    with pytest.raises(error, match=f"row_ids for key 5 .*{match}"):
        kv.row_sparse_pull(5, out=out, row_ids=row_ids)
    np.testing.assert_array_equal(out, np.full((4, 2), -1.0))


# -- optimizer-state files ------------------------------------------------------------


def _scheduled_sgd() -> labkv.optimizers.SGD:
    schedule = labkv.lr_scheduler.FactorScheduler(step=2, factor=0.5, base_lr=1.0)
    return labkv.optimizers.SGD(learning_rate=1.0, momentum=0.5, lr_scheduler=schedule)


def _steps(kv, pattern):
    for keys in pattern:
        kv.push(keys, [np.ones(SHAPE, np.float32)] * len(keys))


@pytest.mark.parametrize("user_key", ["__num_update__", "num_update", "w"])
def test_a_user_key_of_any_name_keeps_its_update_count_through_a_state_file(tmp_path, user_key):
    keys = [user_key, "other"]
    straight, resumed = labkv.create(), labkv.create()
    for store in (straight, resumed):
        store.init(keys, [np.zeros(SHAPE, np.float32)] * 2)
        store.set_optimizer(_scheduled_sgd())
    before = [[user_key], [user_key], [user_key, "other"]]
    _steps(straight, before)
    _steps(resumed, before)
    resumed.save_optimizer_states(tmp_path / "states", dump_optimizer=True)
    fresh = labkv.create()
    fresh.init(keys, resumed.pull(keys))
    fresh.load_optimizer_states(tmp_path / "states")
    after = [[user_key], [user_key, "other"], ["other"]]
    _steps(straight, after)
    _steps(fresh, after)
    for a, b in zip(straight.pull(keys), fresh.pull(keys)):
        np.testing.assert_array_equal(a, b)  # same learning rates: same counts


# -- the multi-device aliasing quirk ------------------------------------------------


def test_an_updater_after_a_multi_device_push_counts_the_next_push_once(kv):
    assert quirk("updater_after_multi_device_push").endswith("-> 90.0")  # MXNet
    kv.init(3, np.zeros(SHAPE, np.float32))
    kv.push(3, [labkv.ones(SHAPE, device=d) for d in labkv.devices(3)])

    def update(key, merged, stored):
        stored += 2 * merged

    kv.set_updater(update)
    kv.push(3, [labkv.full(SHAPE, 10.0, device=d) for d in labkv.devices(3)])
    np.testing.assert_array_equal(kv.pull(3), np.full(SHAPE, 63.0))  # 3 + 2 * 30
