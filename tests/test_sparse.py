"""Row-sparse values (``labkv.sparse``) on the local and device stores: the type,
the store's semantics (checked against MXNet 1.9.1 where it has them), lazy
updates, refusals that change nothing, and the strict CuPy stand-in on two GPUs."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import labkv
import labkv.sparse as sparse
from labkv.optimizers import SGD, Adam
from tests._standin import standin_cupy

SHAPE = (6, 2)


def rsp(rows, value=1.0, shape=SHAPE, dtype=np.float32, device=None):
    data = np.full((len(rows), *shape[1:]), value, dtype)
    return sparse.row_sparse_array((data, rows), shape=shape, device=device)


def table(shape=SHAPE):
    return np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + 1


# -- the type ------------------------------------------------------------------------------


def test_a_row_sparse_array_holds_its_rows_and_converts_both_ways():
    a = sparse.row_sparse_array(([[1, 2], [3, 4]], [1, 4]), shape=SHAPE)
    assert a.stype == "row_sparse" and a.shape == SHAPE and a.dtype == np.float32
    assert a.indices.dtype == np.int64 and a.indices.tolist() == [1, 4]
    dense = a.tostype("default")
    assert dense[1].tolist() == [1, 2] and dense[4].tolist() == [3, 4] and dense.sum() == 10
    back = sparse.cast_storage(dense, "row_sparse")
    assert back.indices.tolist() == [1, 4] and np.array_equal(back.data, a.data)
    assert a.tostype("row_sparse") is not a and a.nbytes == 2 * 2 * 4 + 2 * 8
    with pytest.raises(ValueError, match="unknown storage type 'csr'"):
        a.tostype("csr")


@pytest.mark.parametrize(
    "data, indices, shape, error, match",
    [
        (np.ones((2, 2)), [3, 1], SHAPE, ValueError, "sorted and unique"),
        (np.ones((2, 2)), [1, 1], SHAPE, ValueError, "sorted and unique"),
        (np.ones((2, 2)), [1, 6], SHAPE, IndexError, "index 6 out of range for 6 rows"),
        (np.ones((2, 2)), [-1, 2], SHAPE, IndexError, "index -1 out of range"),
        (np.ones((1, 2)), [1, 2], SHAPE, ValueError, "data has 1 rows for 2 indices"),
        (np.ones((2, 3)), [1, 2], SHAPE, ValueError, r"data rows have shape \(3,\)"),
        (np.ones((2, 2)), [[1, 2]], SHAPE, ValueError, "indices must be 1-D"),
        (np.ones((2, 2)), [0.5, 2], SHAPE, ValueError, "whole numbers"),
        (np.ones((2, 2)), ["a", "b"], SHAPE, TypeError, "indices must be integers"),
    ],
)
def test_bad_parts_are_refused_with_a_clear_error(data, indices, shape, error, match):
    with pytest.raises(error, match=match):
        sparse.row_sparse_array((data, indices), shape=shape)


def test_zeros_retain_arithmetic_and_devices():
    z = sparse.zeros("row_sparse", SHAPE, dtype="float64")
    assert z.data.shape == (0, 2) and z.dtype == np.float64 and z.asnumpy().sum() == 0
    assert sparse.zeros("default", (2,)).tolist() == [0, 0]
    a, b = rsp([0, 3], 1.0), rsp([3, 5], 2.0)
    total = a + b
    assert total.indices.tolist() == [0, 3, 5] and total.data[:, 0].tolist() == [1, 3, 2]
    assert (a * 3).data.max() == 3 and (-a).data.min() == -1 and (a - a).data.max() == 0
    assert sparse.retain(total, [5, 1, 0]).indices.tolist() == [0, 5]
    moved = rsp([2], device=labkv.cpu(2))
    assert moved.device == labkv.cpu(2) and labkv.device_of(moved.data) == labkv.cpu(2)
    z[:] = a
    assert z.indices.tolist() == [0, 3] and z.dtype == np.float64  # kept its dtype


# -- the store ------------------------------------------------------------------------------


@pytest.fixture(params=["local", "device"])
def kv(request):
    return labkv.create(request.param)


def test_pushes_from_several_devices_are_summed_by_the_union_of_their_rows(kv):
    # MXNet 1.9.1 (tests/reference/make_mxnet_sparse_reference.py): with no updater the
    # value becomes the sum: rows not pushed are gone
    kv.init("e", sparse.cast_storage(table(), "row_sparse"))
    grads = [rsp([1], 1.0, device=labkv.cpu(0)), rsp([1, 3], 2.0, device=labkv.cpu(1))]
    kv.push("e", grads)
    got = kv.row_sparse_pull("e", row_ids=np.arange(6))
    assert got.indices.tolist() == list(range(6))
    assert got.data[:, 0].tolist() == [0, 3, 0, 2, 0, 0]
    assert kv.pull("e", out=np.zeros(SHAPE, np.float32)) is None


def test_row_sparse_pull_gives_exactly_the_rows_asked_for_unique_and_sorted(kv):
    kv.init("e", sparse.row_sparse_array((table()[[0, 2, 4]], [0, 2, 4]), shape=SHAPE))
    out = sparse.zeros("row_sparse", SHAPE)
    kv.row_sparse_pull("e", out=out, row_ids=np.array([4, 1, 1, 2], np.float32))
    assert out.indices.tolist() == [1, 2, 4]  # a row the value lacks comes as zeros
    np.testing.assert_array_equal(out.data, [[0, 0], [5, 6], [9, 10]])
    outs = [sparse.zeros("row_sparse", SHAPE), np.full(SHAPE, 7, np.float32)]
    kv.row_sparse_pull("e", out=outs, row_ids=[np.array([2]), np.array([4, 0])])
    assert outs[0].indices.tolist() == [2]
    np.testing.assert_array_equal(outs[1], table() * np.isin(np.arange(6), [0, 4])[:, None])


def test_a_dense_key_pulls_only_the_rows_asked_for_into_a_row_sparse_out(kv):
    kv.init(0, table())
    kv.events.record()
    out = sparse.zeros("row_sparse", SHAPE)
    kv.row_sparse_pull(0, out=out, row_ids=np.array([5]))
    assert out.indices.tolist() == [5] and out.data.tolist() == [[11, 12]]
    (event,) = [e for e in kv.events.recent() if e.op == "pull"]
    assert event.nbytes == 2 * 4 + 8  # one row and its index, not the table


def test_a_pull_into_a_row_sparse_out_is_ignored_with_mxnets_warning(kv):
    kv.init("e", rsp([1, 2], 5.0))
    out = rsp([0], 9.0)
    with pytest.warns(UserWarning, match="non-default weights detected during kvstore pull"):
        kv.pull("e", out=out)
    assert out.indices.tolist() == [0] and out.data.max() == 9
    kv.pull("e", out=out, ignore_sparse=False)
    assert out.indices.tolist() == [1, 2] and out.data.max() == 5
    dense = np.zeros(SHAPE, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kv.pull("e", out=dense)  # into a dense out: the whole value, as MXNet
    assert dense.sum() == 20
    assert isinstance(kv.pull("e"), sparse.RowSparseArray)


def test_refused_pushes_change_nothing(kv):
    kv.init("e", rsp([1], 1.0))
    with pytest.raises(TypeError, match="key 'e' holds a row_sparse value"):
        kv.push("e", np.ones(SHAPE, np.float32))
    with pytest.raises(TypeError, match="mix row_sparse and dense"):
        kv.push("e", [rsp([2]), np.ones(SHAPE, np.float32)])
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    with pytest.raises(ValueError, match="Gradient compression for row sparse storage type"):
        kv.push("e", rsp([3]))
    with pytest.raises(IndexError, match="out of range"):
        kv.row_sparse_pull("e", out=sparse.zeros("row_sparse", SHAPE), row_ids=np.array([6]))
    assert kv.pull("e").indices.tolist() == [1]


def test_a_row_sparse_push_to_a_dense_key_stores_its_dense_form(kv):
    # MXNet 1.9.1: the stored value becomes the (dense) sum
    kv.init(0, table())
    kv.push(0, rsp([2], 3.0))
    expected = np.zeros(SHAPE, np.float32)
    expected[2] = 3.0
    np.testing.assert_array_equal(kv.pull(0), expected)


# -- updates ----------------------------------------------------------------------------------


@pytest.mark.parametrize("stored", ["dense", "row_sparse"])
def test_lazy_sgd_and_adam_change_only_the_rows_pushed_non_lazy_every_row(kv, stored):
    grad = rsp([1, 4], 0.5)
    for make in (SGD, Adam):
        for lazy in (True, False):
            kv = labkv.create("local")
            kv.set_optimizer(
                make(learning_rate=0.1, wd=0.1, momentum=0.9, lazy_update=lazy)
                if make is SGD
                else make(learning_rate=0.1, wd=0.1, lazy_update=lazy)
            )
            value = table() if stored == "dense" else sparse.cast_storage(table(), "row_sparse")
            kv.init(0, value)
            kv.push(0, grad)
            kv.push(0, grad)
            after = kv.row_sparse_pull(0, row_ids=np.arange(6))
            after = after.asnumpy() if stored != "dense" else after
            changed = np.flatnonzero((after != table()).any(axis=1)).tolist()
            assert changed == ([1, 4] if lazy else list(range(6))), (make, lazy)


def test_a_custom_updater_receives_the_row_sparse_merged_gradient(kv):
    seen = []

    def update(key, merged, stored):
        seen.append((merged.stype, merged.indices.tolist(), stored.stype))
        stored[:] = stored + merged

    kv.set_updater(update)
    kv.init(0, sparse.cast_storage(table(), "row_sparse"))
    kv.push(0, [rsp([1], 1.0), rsp([3], 2.0, device=labkv.cpu(1))])
    assert seen == [("row_sparse", [1, 3], "row_sparse")]
    expected = table()
    expected[1] += 1
    expected[3] += 2
    np.testing.assert_array_equal(kv.row_sparse_pull(0, row_ids=np.arange(6)).asnumpy(), expected)


def test_optimizer_states_of_row_sparse_keys_save_and_load(tmp_path):
    def store():
        kv = labkv.create()
        kv.set_optimizer(Adam(learning_rate=0.1))
        kv.init("e", sparse.cast_storage(table(), "row_sparse"))
        return kv

    first = store()
    first.push("e", rsp([2], 1.0))
    first.save_optimizer_states(tmp_path / "s")
    first.push("e", rsp([2, 5], 1.0))
    second = store()
    second.push("e", rsp([2], 1.0))  # the same weight, states loaded
    second.load_optimizer_states(tmp_path / "s")
    second.push("e", rsp([2, 5], 1.0))
    rows = np.arange(6)
    a, b = first.row_sparse_pull("e", row_ids=rows), second.row_sparse_pull("e", row_ids=rows)
    np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())


def test_a_push_event_counts_the_bytes_of_the_rows_moved(kv):
    kv.init("e", sparse.zeros("row_sparse", (1000, 4)))
    kv.events.record()
    kv.push("e", [rsp([1, 7], shape=(1000, 4)), rsp([9], shape=(1000, 4))])
    (event,) = [e for e in kv.events.recent() if e.op == "push"]
    assert event.nbytes == 3 * 4 * 4 + 3 * 8


def test_dist_stores_hold_row_sparse_values():
    # the cluster's own tests: tests/test_cluster_sparse.py
    from tests._inprocess import InProcessCluster

    with InProcessCluster(num_workers=1, num_servers=2) as cluster:
        kv = cluster.ranks[0]
        kv.init("e", rsp([1]))
        kv.push("e", rsp([1, 4]))
        out = sparse.zeros("row_sparse", SHAPE)
        kv.row_sparse_pull("e", out=out, row_ids=np.array([4, 1]))
        assert out.indices.tolist() == [1, 4]
        np.testing.assert_array_equal(out.data, rsp([1, 4]).data)  # no updater: assigned
        kv.init("d", np.zeros(SHAPE, np.float32))
        kv.row_sparse_pull("d", out=out, row_ids=np.array([3]))  # a dense key: rows of it
        assert out.indices.tolist() == [3] and kv.pull("d").sum() == 0


# -- two GPUs on the strict CuPy stand-in --------------------------------------------------------


def test_row_sparse_values_on_two_gpus_never_meet_an_operand_of_another_device():
    with standin_cupy(physical=2) as cp:
        kv = labkv.create("device")
        gpu0, gpu1 = labkv.gpu(0), labkv.gpu(1)
        kv.init("e", sparse.cast_storage(labkv.to_device(table(), gpu1), "row_sparse"))
        kv.init("d", labkv.to_device(table(), gpu1))
        kv.set_optimizer(SGD(learning_rate=1.0, momentum=0.5))
        kv.push("e", [rsp([1], device=gpu0), rsp([1, 3], device=gpu1)])
        kv.push("d", [rsp([1], device=gpu1), rsp([2], device=gpu0)])
        outs = [sparse.zeros("row_sparse", SHAPE, device=gpu1), cp.zeros(SHAPE, cp.float32)]
        with cp.cuda.Device(1):
            outs.append(cp.full(SHAPE, 9, cp.float32))
        pulled = {}
        for key in ("e", "d"):
            assert cp.cuda.runtime.getDevice() == 0
            kv.row_sparse_pull(key, out=outs, row_ids=np.array([3, 1]))
            assert outs[0].device == gpu1 and outs[0].indices.tolist() == [1, 3]
            host = [outs[0].asnumpy()[[1, 3]], outs[1].get()[[1, 3]], outs[2].get()]
            assert np.array_equal(host[0], host[1]) and host[2][[0, 2, 4, 5]].max() == 0
            pulled[key] = host[1]
        rows = table()[[1, 3]]
        np.testing.assert_array_equal(pulled["e"], rows - [[2], [1]])  # 1 + 1 on row 1
        np.testing.assert_array_equal(pulled["d"], rows - [[1], [0]])  # row 2 not asked for
