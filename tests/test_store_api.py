"""The KVStore API on one machine: types, keys, values, outs, devices."""

from __future__ import annotations

import numpy as np
import pytest

import labkv
from labkv.devices import DeviceArray


def test_create_names_are_case_insensitive_and_unknown_names_list_the_valid_ones():
    assert labkv.create("LOCAL").type == "local"
    assert labkv.create("Device").type == "device"
    with pytest.raises(ValueError, match="unknown KVStore type 'nonsense'.*'local'.*'dist_sync'"):
        labkv.create("nonsense")
    with pytest.raises(TypeError):
        labkv.create(3)


def test_identity_rank_workers_capabilities_barrier():
    kv = labkv.create()
    assert (kv.rank, kv.num_workers) == (0, 1)
    assert kv.is_capable("optimizer") and kv.is_capable("OPTIMIZER")
    assert not kv.is_capable("teleport")
    assert kv.barrier() is None and kv._barrier() is None


def test_str_keys_and_lists_of_keys():
    kv = labkv.create()
    kv.init(["a", "b"], [np.zeros(2), np.ones(3)])
    kv.push(["b", "a"], [np.full(3, 4.0), [np.ones(2), np.ones(2)]])
    a, b = kv.pull(["a", "b"])
    np.testing.assert_array_equal(a, [2, 2])
    np.testing.assert_array_equal(b, [4, 4, 4])
    assert kv.keys() == ["a", "b"] and "a" in kv


def test_numpy_integer_keys_count_as_ints():
    kv = labkv.create()
    kv.init(np.int64(4), np.zeros(1))
    kv.push(4, np.ones(1))
    np.testing.assert_array_equal(kv.pull(np.int32(4)), [1])


def test_repeated_key_in_one_call_is_one_update_of_the_sum():
    kv = labkv.create()
    kv.init(0, np.zeros(2))
    calls = []
    kv.set_updater(
        lambda key, merged, stored: (calls.append(merged.copy()), stored.__iadd__(merged))
    )
    kv.push([0, 0], [np.ones(2), [np.ones(2), np.ones(2)]])
    assert len(calls) == 1
    np.testing.assert_array_equal(calls[0], [3, 3])


def test_updater_receives_str_keys_as_str():
    kv = labkv.create()
    kv.init("w", np.zeros(1))
    seen = []
    kv.set_updater(lambda key, merged, stored: seen.append(key))
    kv.push("w", np.ones(1))
    assert seen == ["w"] and type(seen[0]) is str


def test_pushed_values_are_cast_to_the_stored_dtype():
    kv = labkv.create()
    kv.init(0, np.zeros(3, np.float32))
    kv.push(0, [np.array([1, 2, 3], np.int64), np.array([0.5, 0.5, 0.5])])
    out = kv.pull(0)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [1.5, 2.5, 3.5])


def test_pull_writes_every_out_on_its_own_device():
    kv = labkv.create()
    kv.init(1, np.arange(4.0))
    outs = [labkv.zeros(4, device=d) for d in labkv.devices(3)]
    kv.pull(1, out=outs)
    for out, device in zip(outs, labkv.devices(3)):
        np.testing.assert_array_equal(out, [0, 1, 2, 3])
        assert labkv.device_of(out) == device


def test_pull_without_out_returns_new_arrays():
    kv = labkv.create()
    kv.init([1, 2], [np.ones(2), np.zeros(2)])
    one = kv.pull(1)
    one[:] = 9  # a copy, not the stored value
    np.testing.assert_array_equal(kv.pull(1), [1, 1])
    assert isinstance(kv.pull([1, 2]), list)


def test_pushpull_writes_into_value_when_out_is_none_and_into_out_otherwise():
    kv = labkv.create()
    kv.init(0, np.zeros(2))
    grads = [np.ones(2), np.ones(2)]
    kv.pushpull(0, grads)
    np.testing.assert_array_equal(grads[1], [2, 2])
    out = np.zeros(2)
    kv.pushpull(0, np.full(2, 5.0), out=out)
    np.testing.assert_array_equal(out, [5, 5])


def test_broadcast_initialises_and_fills_outs():
    kv = labkv.create()
    outs = [labkv.zeros(3, device=d) for d in labkv.devices(2)]
    kv.broadcast("w", labkv.full(3, 7.0), out=outs)
    np.testing.assert_array_equal(outs[1], [7, 7, 7])
    with pytest.raises(ValueError, match="already initialised"):
        kv.broadcast("w", labkv.full(3, 7.0), out=outs)


def test_row_sparse_pull_fills_only_the_requested_rows():
    kv = labkv.create()
    kv.init("emb", np.arange(12.0).reshape(4, 3))
    outs = [np.full((4, 3), -1.0), np.full((4, 3), -1.0)]
    kv.row_sparse_pull("emb", out=outs, row_ids=[np.array([0, 2]), np.array([3])])
    np.testing.assert_array_equal(outs[0], [[0, 1, 2], [0, 0, 0], [6, 7, 8], [0, 0, 0]])
    np.testing.assert_array_equal(outs[1], [[0, 0, 0], [0, 0, 0], [0, 0, 0], [9, 10, 11]])
    with pytest.raises(IndexError, match="out of range"):
        kv.row_sparse_pull("emb", out=outs[0], row_ids=np.array([4]))
    with pytest.raises(ValueError, match="whole numbers; got 0.5"):
        kv.row_sparse_pull("emb", out=outs[0], row_ids=np.array([0.5]))
    np.testing.assert_array_equal(outs[1][3], [9, 10, 11])  # refused calls wrote nothing


class ArrayLike:
    """A foreign array type that only offers __array__ (like many tensor libraries)."""

    def __init__(self, data):
        self.data = np.asarray(data)

    def __array__(self, dtype=None, copy=None):
        return self.data


class DLPackOnly:
    """A foreign array that only offers the DLPack protocol."""

    def __init__(self, data):
        self.data = np.asarray(data)

    def __dlpack__(self, **kwargs):
        return self.data.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.data.__dlpack_device__()


def test_foreign_arrays_are_accepted_by_conversion():
    kv = labkv.create()
    kv.init(0, ArrayLike([1.0, 2.0]))
    kv.push(0, [ArrayLike([1.0, 1.0]), DLPackOnly([2.0, 2.0])])
    np.testing.assert_array_equal(kv.pull(0), [3, 3])


def test_devices_and_array_helpers():
    assert labkv.cpu(1) == labkv.Device("cpu", 1) and repr(labkv.gpu(2)) == "gpu(2)"
    sims = labkv.devices(3)
    if labkv.num_gpus() < 3:
        assert sims == [labkv.cpu(0), labkv.cpu(1), labkv.cpu(2)]
    a = labkv.ones((2, 2), device=labkv.cpu(2))
    assert isinstance(a, DeviceArray) and labkv.device_of(a + 1) == labkv.cpu(2)
    assert labkv.zeros(3).dtype == np.float32 and labkv.full(2, 3, dtype="int32").dtype == np.int32
    np.testing.assert_array_equal(labkv.array([1, 2], device=labkv.cpu(1)), [1, 2])
    with pytest.raises(ValueError):
        labkv.devices(0)
    with pytest.raises(ValueError):
        labkv.Device("tpu", 0)


@pytest.mark.skipif(labkv.num_gpus() > 0, reason="checks the message on machines without a GPU")
def test_gpu_arrays_without_a_gpu_give_a_clear_error():
    with pytest.raises(RuntimeError, match="needs CuPy and a CUDA GPU"):
        labkv.ones(2, device=labkv.gpu(0))


def test_public_api_is_sorted_and_complete():
    assert labkv.__all__ == sorted(labkv.__all__)
    for name in labkv.__all__:
        assert hasattr(labkv, name), name
    for name in ("create", "cpu", "gpu", "devices", "ones", "zeros", "full", "array", "KVStore"):
        assert name in labkv.__all__


@pytest.mark.parametrize("kind", ["local", "device"])
def test_peek_and_placement_are_methods_of_every_store_with_the_base_signature(kind):
    import inspect

    from labkv.cluster._rank.dist_store import DistStore
    from labkv.store import KVStore

    for method in ("peek", "placement"):
        base = inspect.signature(getattr(KVStore, method)).parameters
        for store in (type(labkv.create(kind)), DistStore):
            assert inspect.signature(getattr(store, method)).parameters.keys() == base.keys()
    kv = labkv.create(kind)
    kv.init("w", np.arange(3.0))
    seen = []
    with kv.events.subscribe(seen.append):
        copy = kv.peek("w")
        copy[0] = 9.0  # a copy: the store keeps its value
        assert kv.placement() == {
            "w": [{"server": None, "device": "cpu(0)", "start": 0, "stop": 3}]
        }
    assert seen == [] and kv.pull("w")[0] == 0.0  # no event: not a pull
    with pytest.raises(KeyError, match="not initialised"):
        kv.peek("x")


def test_already_initialised_is_one_rule_for_the_store_and_its_shard():
    from labkv.shard import Shard

    kv, shard = labkv.create(), Shard()
    kv.init(1, np.zeros(2))
    shard.init(1, np.zeros(2))
    errors = []
    for init in (lambda: kv.init([2, 1], [np.zeros(2)] * 2), lambda: shard.init(1, np.zeros(2))):
        with pytest.raises(ValueError) as info:
            init()
        errors.append(str(info.value))
    assert errors == ["key 1 is already initialised"] * 2
    assert kv.keys() == [1]  # the failed call changed nothing


def _owned_shard(mode):
    from labkv.shard import Shard

    shard = Shard()
    shard.init("w", np.zeros(4, np.float32))
    if mode == "optimizer":
        shard.set_optimizer(labkv.optimizers.SGD(learning_rate=0.5))
    elif mode == "updater":
        shard.set_updater(lambda key, grad, stored: stored.__isub__(grad))
    return shard


@pytest.mark.parametrize("mode", ["assign", "optimizer", "updater"])
def test_an_owned_value_is_kept_in_place_of_a_copy_with_the_same_bits(mode):
    owned, copied = _owned_shard(mode), _owned_shard(mode)
    for step in range(3):
        grad = np.arange(4, dtype=np.float32) * (step + 1)
        copied.apply([("w", [grad.copy()])])
        owned.apply([("w", [grad])], owned=True)
        kept = owned.read("w") if mode == "assign" else owned.merged("w")
        assert kept is grad  # no copy made
        assert copied.read("w") is not grad
        np.testing.assert_array_equal(owned.read("w"), copied.read("w"))


@pytest.mark.parametrize(
    "values",
    [
        [np.ones(4, np.float64)],  # another dtype: cast while copied
        [np.ones(4, np.float32), np.ones(4, np.float32)],  # a sum
        [np.ones(8, np.float32)[::2]],  # not contiguous
    ],
    ids=["dtype", "two", "strided"],
)
def test_an_owned_value_that_cannot_stand_in_is_copied(values):
    shard = _owned_shard("assign")
    stored = shard.read("w")
    shard.apply([("w", values)], owned=True)
    assert shard.read("w") is stored
    np.testing.assert_array_equal(stored, sum(v.astype(np.float32) for v in values))


def test_an_interrupted_push_of_several_keys_on_a_local_store_changes_all_or_none():
    import os
    import random
    import signal
    import threading
    import time

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("needs the main thread")
    kv = labkv.create("local")
    keys = list(range(32))
    kv.init(keys, [np.zeros(1 << 18, np.float32)] * len(keys))
    # w -= 1 * (-1 * grad): every key's value counts the pushes applied to it
    kv.set_optimizer(labkv.optimizers.SGD(learning_rate=1.0, rescale_grad=-1.0))
    values = [np.ones(1 << 18, np.float32)] * len(keys)
    start = time.perf_counter()
    kv.push(keys, values)
    took = time.perf_counter() - start  # how long one push of the 32 keys takes here
    rng = random.Random(3)
    inside = 0
    for _ in range(40):
        killer, pushing = None, False
        try:
            delay = rng.uniform(0, took)
            killer = threading.Thread(
                target=lambda d=delay: (time.sleep(d), os.kill(os.getpid(), signal.SIGINT))
            )
            killer.start()
            pushing = True
            kv.push(keys, values)
            pushing = False
            killer.join()
            time.sleep(0.01)
        except KeyboardInterrupt:
            inside += pushing
        if killer is not None:
            killer.join()
        firsts = {float(kv.pull(k)[0]) for k in keys}
        assert len(firsts) == 1, firsts  # every key holds the same pushes: all or none
    assert inside >= 10  # the signals landed inside pushes
