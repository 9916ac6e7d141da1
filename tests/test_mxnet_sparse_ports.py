"""MXNet 1.9.1's own row-sparse KVStore test cases, ported to labkv.

Sources (tag ``1.9.1`` of apache/mxnet): ``tests/python/unittest/test_kvstore.py``,
``tests/python/gpu/test_kvstore_gpu.py``, ``tests/nightly/test_kvstore.py``,
``tests/nightly/dist_sync_kvstore.py`` and ``tests/nightly/dist_async_kvstore.py``.
Each test is named after the MXNet test it ports and says which in its docstring;
the spelling is translated (``mx.nd.ones(s).tostype('row_sparse')`` is
``sparse.cast_storage(ones, 'row_sparse')``, ``mx.cpu(i)``/``mx.gpu(i)`` are labkv's
simulated ``cpu(i)`` devices, and ``gpu(i)`` on the strict CuPy stand-in where MXNet
needs GPUs, ``kv._set_updater`` is ``set_updater``, MXNet's ``'test'`` optimizer,
``w += rescale_grad * g``, is the updater :func:`_test_optimizer`), the assertions are
MXNet's. The dist cases run on in-process servers with 3 ranks (MXNet's nightly runs
them with several workers), and ``gluon.Trainer`` cases become ``labkv.torch`` cases.

Not here, because they have no row-sparse part: ``test_init``, ``test_pull``,
``test_get_type``, ``test_gluon_trainer_step`` and the compression cases (dense:
``tests/test_mxnet_ports.py``, ``tests/test_compression.py``). Where a case cannot
apply, a skip says why; where labkv deliberately differs (``docs/mxnet_differences.md``),
the test checks labkv's documented behaviour and says so.
"""

from __future__ import annotations

import numpy as np
import pytest

import labkv
import labkv.sparse as sparse
from tests._inprocess import InProcessCluster
from tests._standin import standin_cupy
from tests._waiting import in_threads

SHAPE = (4, 4)
KEYS = [5, 7, 11]
STR_KEYS = ["b", "c", "d"]


def _ones(shape=SHAPE, device=None, dtype=np.float32):
    return labkv.ones(shape, device=device, dtype=dtype)


def _tostype(array, stype: str):
    return sparse.cast_storage(array, "row_sparse") if stype == "row_sparse" else array


def _zeros_of(stype: str, shape=SHAPE):
    return sparse.zeros("row_sparse", shape) if stype == "row_sparse" else labkv.zeros(shape)


def init_kv(stype: str = "default", kv_type: str = "local"):
    """MXNet's ``init_kv``: key 3 and KEYS, zeros of ``stype``."""
    kv = labkv.create(kv_type)
    kv.init(3, _zeros_of(stype))
    kv.init(KEYS, [_zeros_of(stype)] * len(KEYS))
    return kv


def init_kv_with_str(stype: str = "default", kv_type: str = "local"):
    """MXNet's ``init_kv_with_str``: key 'a' and STR_KEYS, zeros of ``stype``."""
    kv = labkv.create(kv_type)
    kv.init("a", _zeros_of(stype))
    kv.init(STR_KEYS, [_zeros_of(stype)] * len(STR_KEYS))
    return kv


def check_diff_to_scalar(a, x):
    dense = a.asnumpy() if isinstance(a, sparse.RowSparseArray) else labkv.to_device(a, labkv.cpu())
    assert np.sum(np.abs(np.asarray(dense) - x)) == 0


def _asnumpy(a) -> np.ndarray:
    if isinstance(a, sparse.RowSparseArray):
        return a.asnumpy()
    return a.get() if hasattr(a, "get") else np.asarray(a)


def rand_ndarray(shape, stype: str, rng: np.random.Generator, device=None, dtype=np.float32):
    """``mx.test_utils.rand_ndarray``: uniform values; a row-sparse one holds a
    random subset of rows (density drawn in [0, 1), as MXNet's default)."""
    dense = rng.uniform(size=shape).astype(dtype)
    if stype == "row_sparse":
        keep = rng.uniform(size=shape[0]) < rng.uniform()
        dense[~keep] = 0
        value = sparse.cast_storage(dense, "row_sparse")
        return value.copyto(device) if device is not None else value
    return labkv.to_device(dense, device) if device is not None else dense


def _test_optimizer(rescale_grad: float):
    """MXNet's ``mx.optimizer.create('test', rescale_grad=r)``: ``w += r * g``, a
    row-sparse ``g`` added to its rows (MXNet's ``weight[:] += grad * rescale_grad``)."""

    def update(key, grad, weight):
        weight += grad * rescale_grad

    return update


# -- tests/python/unittest/test_kvstore.py ----------------------------------------------------
@pytest.mark.parametrize("stype", ["default", "row_sparse"])
def test_single_kv_pair(stype):
    """Ports ``test_kvstore.py::test_single_kv_pair``: a push of ``stype`` ones to a
    dense key, int and str, pulled dense."""
    for kv, key in ((init_kv(), 3), (init_kv_with_str(), "a")):
        kv.push(key, _tostype(_ones(), stype))
        val = np.empty(SHAPE, np.float32)
        kv.pull(key, out=val)
        check_diff_to_scalar(val, 1)


@pytest.mark.parametrize("count", [1, 4])
def test_row_sparse_pull(count):
    """Ports ``test_kvstore.py::test_row_sparse_pull``: ``count`` row-sparse outs, each
    with its own random 2-D float row ids, get exactly the rows asked for."""
    rng = np.random.default_rng(count)
    kv = init_kv_with_str("row_sparse")
    kv.init("e", _tostype(_ones(), "row_sparse"))
    num_rows = SHAPE[0]
    vals = [_tostype(labkv.zeros(SHAPE), "row_sparse") for _ in range(count)]
    row_ids = [
        rng.integers(num_rows, size=num_rows).astype(np.float32).reshape(2, num_rows // 2)
        for _ in range(count)
    ]
    kv.row_sparse_pull(
        "e", out=vals[0] if count == 1 else vals, row_ids=row_ids[0] if count == 1 else row_ids
    )
    for val, row_id in zip(vals, row_ids, strict=True):
        retained = val.asnumpy()
        excluded = np.setdiff1d(np.arange(num_rows), row_id)
        for row in range(num_rows):
            expected = np.zeros_like(retained[row]) + (0 if row in excluded else 1)
            np.testing.assert_allclose(retained[row], expected)


@pytest.mark.parametrize("stype", ["default", "row_sparse"])
def test_list_kv_pair(stype):
    """Ports ``test_kvstore.py::test_list_kv_pair``: lists of ``stype`` pushes (4s)
    to dense keys, pulled dense."""
    for kv, keys in ((init_kv(), KEYS), (init_kv_with_str(), STR_KEYS)):
        kv.push(keys, [_tostype(_ones() * 4, stype)] * len(keys))
        val = [np.empty(SHAPE, np.float32) for _ in keys]
        kv.pull(keys, out=val)
        for v in val:
            check_diff_to_scalar(v, 4)


@pytest.mark.parametrize("stype", ["default", "row_sparse"])
def test_aggregator(stype):
    """Ports ``test_kvstore.py::test_aggregator``: ``stype`` pushes from 4 devices are
    summed into a dense key, pulled into outs on each device; then lists of keys."""
    num_devs = 4
    devs = [labkv.cpu(i) for i in range(num_devs)]
    for kv, key, key_list in ((init_kv(), 3, KEYS), (init_kv_with_str(), "a", STR_KEYS)):
        vals = [_tostype(_ones(device=d), stype) for d in devs]
        outs = [labkv.zeros(SHAPE, device=d) for d in devs]
        kv.push(key, vals)
        kv.pull(key, out=outs)
        for out, d in zip(outs, devs, strict=True):
            assert labkv.device_of(out) == d
            check_diff_to_scalar(out, num_devs)
        vals = [[_tostype(_ones(device=d) * 2.0, stype) for d in devs]] * len(key_list)
        outs = [[labkv.zeros(SHAPE, device=d) for d in devs] for _ in key_list]
        kv.push(key_list, vals)
        kv.pull(key_list, out=outs)
        for out in outs:
            for o in out:
                check_diff_to_scalar(o, num_devs * 2.0)


@pytest.mark.parametrize("sparse_pull", [False, True])
def test_sparse_aggregator(sparse_pull):
    """Ports ``test_kvstore.py::test_sparse_aggregator``: random row-sparse values on
    4 devices pushed to row-sparse keys (one, then a list) and pulled back into them,
    by ``pull(ignore_sparse=False)`` or ``row_sparse_pull`` of every row: the outs
    add up to the pushed sum times the number of devices."""
    rng = np.random.default_rng(int(sparse_pull))
    kv = init_kv_with_str("row_sparse")
    num_devs = 4
    devs = [labkv.cpu(i) for i in range(num_devs)]
    all_rows = np.arange(SHAPE[0]).astype(np.float32)  # mx.nd.array: float32
    vals = [rand_ndarray(SHAPE, "row_sparse", rng, devs[i]) for i in range(num_devs)]
    expected_sum = sum(v.asnumpy() for v in vals)
    kv.push("a", vals)
    if sparse_pull:
        kv.row_sparse_pull("a", out=vals, row_ids=[all_rows] * len(vals))
    else:
        kv.pull("a", out=vals, ignore_sparse=False)
    assert [v.device for v in vals] == devs
    np.testing.assert_allclose(sum(v.asnumpy() for v in vals), expected_sum * num_devs, rtol=1e-6)
    # list: MXNet's ``[[...]] * len(keys)`` shares one list of outs between the keys
    vals = [[rand_ndarray(SHAPE, "row_sparse", rng, devs[i]) for i in range(num_devs)]] * len(KEYS)
    expected_sum = sum(v.asnumpy() for v in vals[0])
    kv.push(STR_KEYS, vals)
    if sparse_pull:
        kv.row_sparse_pull(STR_KEYS, out=vals, row_ids=[[all_rows] * num_devs] * len(vals))
    else:
        kv.pull(STR_KEYS, out=vals, ignore_sparse=False)
    for vv in vals:
        total = sum(v.asnumpy() for v in vv)
        np.testing.assert_allclose(total, expected_sum * num_devs, rtol=1e-6)


def _int_updater(key, recv, local):
    assert isinstance(key, int)
    local += recv


def _str_updater(key, recv, local):
    assert isinstance(key, str)
    local += recv


@pytest.mark.parametrize("stype", ["default", "row_sparse"])
def test_updater(stype):
    """Ports ``test_kvstore.py::test_updater``: an updater ``local += recv`` (dense
    ``local``, ``stype`` ``recv``: labkv's updater gets the row-sparse merged
    gradient, which adds into a dense array as MXNet's does) with int and str keys."""
    num_devs, num_push = 4, 4
    devs = [labkv.cpu(i) for i in range(num_devs)]
    for kv, updater, key, key_list in (
        (init_kv(), _int_updater, 3, KEYS),
        (init_kv_with_str(), _str_updater, "a", STR_KEYS),
    ):
        kv.set_updater(updater)
        vals = [_tostype(_ones(device=d), stype) for d in devs]
        outs = [labkv.zeros(SHAPE, device=d) for d in devs]
        kv.push(key, vals)
        kv.pull(key, out=outs)
        for out in outs:
            check_diff_to_scalar(out, num_devs)
        vals = [[_tostype(_ones(device=d), stype) for d in devs]] * len(key_list)
        outs = [[labkv.zeros(SHAPE, device=d) for d in devs] for _ in key_list]
        for _ in range(num_push):
            kv.push(key_list, vals)
        kv.pull(key_list, out=outs)
        for out in outs:
            for o in out:
                check_diff_to_scalar(o, num_devs * num_push)


@pytest.mark.parametrize("which", [0, 1], ids=["int-keys", "str-keys"])
def test_invalid_pull(which):
    """Ports ``test_kvstore.py::test_invalid_pull``: a ``pull`` into row-sparse outs is
    ignored (MXNet's warning; the outs keep their values); keys of the other kind are
    refused. MXNet also refuses a ``row_sparse_pull`` into a dense out; labkv
    deliberately takes it (``docs/mxnet_differences.md``: the rows asked for, the
    others zero), which is checked here instead."""
    kv = [init_kv(), init_kv_with_str()][which]
    single, keys = [3, "a"][which], [KEYS, STR_KEYS][which]
    other_single, other_keys = [3, "a"][1 - which], [KEYS, STR_KEYS][1 - which]
    # check_ignored_pull_single / _list
    with pytest.warns(UserWarning, match="non-default weights detected during kvstore pull"):
        rsp_val = _tostype(_ones() * 2, "row_sparse")
        kv.pull(single, out=rsp_val)
    check_diff_to_scalar(rsp_val, 2)
    with pytest.warns(UserWarning, match="This call has been ignored"):
        rsp_vals = [_tostype(_ones() * 2, "row_sparse") for _ in keys]
        kv.pull(keys, out=rsp_vals)
    for v in rsp_vals:
        check_diff_to_scalar(v, 2)
    # check_invalid_rsp_pull_single / _list: labkv fills the dense out (see docstring)
    dns_val = _ones() * 2
    kv.row_sparse_pull(single, out=dns_val, row_ids=np.array([1.0], np.float32))
    check_diff_to_scalar(dns_val, 0)  # row 1 of a zero key, the other rows zeroed
    dns_vals = [_ones() * 2 for _ in keys]
    kv.row_sparse_pull(keys, out=dns_vals, row_ids=[np.array([1.0])] * len(keys))
    for v in dns_vals:
        check_diff_to_scalar(v, 0)
    # check_invalid_key_types_single / _list
    dns_val, rsp_val = _ones() * 2, _tostype(_ones() * 2, "row_sparse")
    for call in (
        lambda: kv.init(other_single, dns_val),
        lambda: kv.push(other_single, dns_val),
        lambda: kv.pull(other_single, dns_val),
        lambda: kv.row_sparse_pull(other_single, rsp_val, row_ids=np.array([1.0])),
        lambda: kv.init(other_keys, [dns_val] * 3),
        lambda: kv.push(other_keys, [dns_val] * 3),
        lambda: kv.pull(other_keys, [dns_val] * 3),
        lambda: kv.row_sparse_pull(other_keys, [rsp_val] * 3, row_ids=[np.array([1.0])] * 3),
    ):
        with pytest.raises(TypeError, match="one store takes one kind of key"):
            call()


# -- tests/python/gpu/test_kvstore_gpu.py -------------------------------------------------------
@pytest.fixture(
    params=[
        "cpu",
        "standin",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(labkv.num_gpus() < 2, reason="MXNet's cases need 2 GPUs"),
            ],
        ),
    ],
    ids=["cpu-devices", "standin-gpus", "cuda"],
)
def gpus(request):
    """MXNet's GPUs: labkv's simulated CPU devices, two GPUs of the strict CuPy
    stand-in, or real CUDA GPUs (where there are two)."""
    if request.param == "standin":
        with standin_cupy(physical=2):
            yield labkv.gpu, labkv.cpu
        return
    yield (labkv.gpu if request.param == "cuda" else labkv.cpu), labkv.cpu


def _check_rsp_pull(kv, devices, sparse_pull, rng, same_rowid=False, use_slice=False):
    count, num_rows = len(devices), SHAPE[0]
    vals = [sparse.zeros("row_sparse", SHAPE, device=d) for d in devices]
    if same_rowid:
        row_ids = [rng.integers(num_rows, size=num_rows).astype(np.float32)] * count
    elif use_slice:
        total = rng.integers(num_rows, size=count * num_rows).astype(np.float32)
        row_ids = [total[i * num_rows : (i + 1) * num_rows] for i in range(count)]
    else:
        row_ids = [rng.integers(num_rows, size=num_rows).astype(np.float32) for _ in devices]
    pull_ids = row_ids[0] if (count == 1 or same_rowid) else row_ids
    kv.row_sparse_pull("e", out=vals[0] if count == 1 else vals, row_ids=pull_ids)
    for val, row_id, device in zip(vals, row_ids, devices, strict=True):
        assert val.device == device
        retained = val.asnumpy()
        excluded = np.setdiff1d(np.arange(num_rows), row_id)
        for row in range(num_rows):
            expected = np.zeros_like(retained[row]) + (0 if row in excluded else 2)
            np.testing.assert_allclose(retained[row], expected)
    if sparse_pull:
        kv.pull("e", out=vals[0] if count == 1 else vals, ignore_sparse=False)
        for val in vals:
            np.testing.assert_allclose(val.asnumpy(), np.full(SHAPE, 2.0))


@pytest.mark.parametrize("sparse_pull", [True, False])
@pytest.mark.parametrize(
    ("kv_type", "push_on_gpu"), [("local", False), ("device", False), ("device", True)]
)
def test_rsp_push_pull(gpus, kv_type, push_on_gpu, sparse_pull):
    """Ports ``test_kvstore_gpu.py::test_rsp_push_pull``: ones pushed from 2 devices
    (CPUs, or GPUs) to a row-sparse key, pulled by rows into outs on one GPU, one
    CPU, 4 outs on 2 GPUs, on 4 CPUs, with one set of row ids, with one each, or
    slices of one array; with ``sparse_pull`` also a ``pull(ignore_sparse=False)``.
    MXNet runs it twice, with ``MXNET_KVSTORE_USETREE`` unset (``sparse_pull``) and
    ``1`` (no ``pull`` check); labkv has no tree reduction, so the two runs are the
    two values of ``sparse_pull`` on labkv's one reduction."""
    gpu, cpu = gpus
    rng = np.random.default_rng(7)
    kv = init_kv_with_str("row_sparse", kv_type)
    kv.init("e", _tostype(_ones(), "row_sparse"))
    push_devs = [gpu(i) if push_on_gpu else cpu(i) for i in range(2)]
    kv.push("e", [_tostype(_ones(device=d), "row_sparse") for d in push_devs])
    for devices, extra in [
        ([gpu(0)], {}),
        ([cpu(0)], {}),
        ([gpu(i // 2) for i in range(4)], {}),
        ([gpu(i // 2) for i in range(4)], {"same_rowid": True}),
        ([cpu(i) for i in range(4)], {}),
        ([cpu(i) for i in range(4)], {"same_rowid": True}),
        ([gpu(i // 2) for i in range(4)], {"use_slice": True}),
        ([cpu(i) for i in range(4)], {"use_slice": True}),
    ]:
        _check_rsp_pull(kv, devices, sparse_pull, rng, **extra)


def test_row_sparse_pull_single_device(gpus):
    """Ports ``test_kvstore_gpu.py::test_row_sparse_pull_single_device``: a 'device'
    store; a random normal value on gpu(0) as row-sparse, initialised, pushed, and
    pulled back by its own indices into itself."""
    gpu, _ = gpus
    copy = labkv.to_device(np.random.default_rng(3).normal(size=SHAPE).astype(np.float32), gpu(0))
    grad = sparse.cast_storage(copy, "row_sparse")
    kv = labkv.create("device")
    kv.init(0, grad)
    idx = grad.indices
    kv.push(0, grad)
    kv.row_sparse_pull(0, out=grad, row_ids=idx)
    assert grad.device == gpu(0)
    np.testing.assert_allclose(grad.asnumpy(), _asnumpy(copy))


def test_rsp_push_pull_large_rowid(gpus):
    """Ports ``test_kvstore_gpu.py::test_rsp_push_pull_large_rowid``: 793,470 rows of
    one column on a GPU, every row pulled back."""
    gpu, _ = gpus
    num_rows = 793_470
    val = sparse.cast_storage(_ones((num_rows, 1)), "row_sparse").copyto(gpu(0))
    kv = labkv.create("device")
    kv.init("a", val)
    out = sparse.zeros("row_sparse", (num_rows, 1)).copyto(gpu(0))
    kv.push("a", val)
    kv.row_sparse_pull("a", out=out, row_ids=np.arange(0, num_rows, dtype=np.int64))
    assert out.indices.shape[0] == num_rows


# -- tests/nightly/test_kvstore.py ----------------------------------------------------------------
# MXNet: shapes (4, 4), (100, 100), (2000, 2000), 4 devices, 10 repeats. Here the last
# shape is (1100, 1000) (still above MXNet's bigarray bound of 1e6 elements) and 3
# repeats, to fit a 2-core CI.
NIGHTLY_KEYS, NIGHTLY_SHAPES = [3, 5, 7], [(4, 4), (100, 100), (1100, 1000)]
NIGHTLY_LR, NIGHTLY_WORKERS, NIGHTLY_REPEAT = 0.1, 4, 3


def _nightly_data():
    rng = np.random.default_rng(11)
    return [
        [
            [(rng.random(s, dtype=np.float32) * 2 - 1) for _ in range(NIGHTLY_WORKERS)]
            for s in NIGHTLY_SHAPES
        ]
        for _ in range(NIGHTLY_REPEAT)
    ]


@pytest.mark.parametrize(
    "kv_type", ["local_update_cpu", "local_allreduce_cpu", "local_allreduce_device"]
)
def test_kvstore(kv_type):
    """Ports ``nightly/test_kvstore.py::test_kvstore(kv_type, 'row_sparse')``: per key,
    row-sparse pushes from 4 devices with MXNet's 'test' optimizer; every device's pull
    is the running sum times the rate (relative error < 1e-6). Its compression checks
    that follow are dense (``tests/test_compression.py``)."""
    data = _nightly_data()
    kv = labkv.create(kv_type)
    kv.set_updater(_test_optimizer(NIGHTLY_LR))
    for k, s in zip(NIGHTLY_KEYS, NIGHTLY_SHAPES, strict=True):
        kv.init(k, np.zeros(s, np.float32))
    res = [np.zeros(s) for s in NIGHTLY_SHAPES]
    for i in range(NIGHTLY_REPEAT):
        for j, key in enumerate(NIGHTLY_KEYS):
            kv.push(
                key,
                [
                    sparse.cast_storage(labkv.to_device(data[i][j][g], labkv.cpu(g)), "row_sparse")
                    for g in range(NIGHTLY_WORKERS)
                ],
            )
        res = [a + b * NIGHTLY_LR for a, b in zip(res, [sum(d) for d in data[i]], strict=True)]
        for j, key in enumerate(NIGHTLY_KEYS):
            out = [labkv.zeros(NIGHTLY_SHAPES[j], device=labkv.cpu(g)) for g in range(4)]
            kv.pull(key, out=out)
            err = sum(np.sum(np.abs(np.asarray(o) - res[j])) for o in out) / np.sum(np.abs(res[j]))
            assert err < 1e-6, (err, NIGHTLY_SHAPES[j])


@pytest.mark.parametrize(
    "kv_type", ["local_update_cpu", "local_allreduce_cpu", "local_allreduce_device"]
)
def test_group_kvstore(kv_type):
    """Ports ``nightly/test_kvstore.py::test_group_kvstore(kv_type, 'row_sparse')``:
    the same through lists of keys, one push and one pull per repeat."""
    data = _nightly_data()
    kv = labkv.create(kv_type)
    kv.set_updater(_test_optimizer(NIGHTLY_LR))
    kv.init(NIGHTLY_KEYS, [np.zeros(s, np.float32) for s in NIGHTLY_SHAPES])
    res = [np.zeros(s) for s in NIGHTLY_SHAPES]
    out = [[labkv.zeros(s, device=labkv.cpu(g)) for g in range(4)] for s in NIGHTLY_SHAPES]
    for i in range(NIGHTLY_REPEAT):
        kv.push(
            NIGHTLY_KEYS,
            [
                [
                    sparse.cast_storage(labkv.to_device(data[i][j][g], labkv.cpu(g)), "row_sparse")
                    for g in range(NIGHTLY_WORKERS)
                ]
                for j in range(len(NIGHTLY_KEYS))
            ],
        )
        kv.pull(NIGHTLY_KEYS, out=out)
        res = [a + b * NIGHTLY_LR for a, b in zip(res, [sum(d) for d in data[i]], strict=True)]
        for a, b in zip(res, out, strict=True):
            err = sum(np.sum(np.abs(np.asarray(o) - a)) for o in b) / np.sum(np.abs(a))
            assert err < 1e-6, (err, a.shape)


# -- tests/nightly/dist_sync_kvstore.py ---------------------------------------------------------
DIST_SHAPE, BIG_SHAPE, RATE, DIST_REPEAT, WORKERS = (2, 3), (1200, 1200), 2, 3, 3


def _on_dist_sync(rank_fn, workers: int = WORKERS, servers: int = 2):
    """Every rank of an in-process dist_sync store with MXNet's ``init_kv`` (the
    row-sparse keys, float32 and float16) and ``set_optimizer('test', rescale_grad=2)``
    runs ``rank_fn(kv)``; their results."""
    with InProcessCluster(
        "dist_sync", servers, workers, timeout=60.0, bigarray_bound=1_000_000
    ) as c:

        def rank(kv):
            for dtype, small, big in (
                ("float32", ["9", "11", "13"], ["97"]),
                ("float16", ["10", "12", "14"], ["98"]),
            ):
                ones, big_ones = _ones(DIST_SHAPE, dtype=dtype), _ones(BIG_SHAPE, dtype=dtype)
                kv.init(small, [sparse.cast_storage(ones, "row_sparse")] * len(small))
                kv.init(big, [sparse.cast_storage(big_ones, "row_sparse")] * len(big))
            kv.set_updater(_test_optimizer(RATE))
            return rank_fn(kv)

        return in_threads(*[lambda kv=kv: rank(kv) for kv in c.ranks], timeout=300)


def _check_diff(a, expected, rank):
    got = a.asnumpy() if isinstance(a, sparse.RowSparseArray) else np.asarray(a)
    assert np.sum(np.abs(got.astype(np.float64) - expected)) == 0, (rank, got, expected)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_sync_push_pull_row_sparse_keys(dtype):
    """Ports ``dist_sync_kvstore.py::test_sync_push_pull``'s ``check_row_sparse_keys``
    and ``check_row_sparse_keys_with_zeros`` (its ``check_default_keys`` is dense):
    each rank pushes ``rank+1`` into row ``rank % 2``; every rank's ``row_sparse_pull``
    of random rows (2-D row ids of ``dtype``) sees every rank's update; pushes of no
    rows change nothing, and a pull of no rows gives none."""
    key, key_zeros, key_big = ("9", "11", "97") if dtype == "float32" else ("10", "12", "98")
    rng_seed = {"float16": 0, "float32": 1}[dtype]

    def rank_fn(kv):
        rng = np.random.default_rng(rng_seed + 10 * kv.rank)
        nworker, s = kv.num_workers, DIST_SHAPE
        v = np.zeros(s, dtype)
        v[kv.rank % s[0]] = kv.rank + 1
        for i in range(DIST_REPEAT):
            kv.push(key, sparse.cast_storage(v, "row_sparse"))
            row_ids_np = rng.integers(s[0], size=s[0])
            row_ids = row_ids_np.reshape(s[0] // 2, 2).astype(dtype)
            val = sparse.zeros("row_sparse", s, dtype=dtype)
            kv.row_sparse_pull(key, out=val, row_ids=row_ids)
            updated = np.ones(s)
            for r in range(nworker):
                updated[r % s[0]] += (r + 1) * RATE * (i + 1)
            expected = np.zeros(s)
            for row in row_ids_np:
                expected[row] = updated[row]
            _check_diff(val, expected, kv.rank)
        # check_row_sparse_keys_with_zeros
        for _ in range(DIST_REPEAT):
            kv.push(key_zeros, sparse.zeros("row_sparse", s, dtype=dtype))
            kv.push(key_big, sparse.zeros("row_sparse", BIG_SHAPE, dtype=dtype))
            val = sparse.zeros("row_sparse", s)
            big_val = sparse.zeros("row_sparse", BIG_SHAPE)
            kv.row_sparse_pull(key_zeros, out=val, row_ids=np.arange(s[0]).astype(np.float32))
            kv.row_sparse_pull(
                key_big, out=big_val, row_ids=np.arange(BIG_SHAPE[0]).astype(np.float32)
            )
            _check_diff(val, 1, kv.rank)
            _check_diff(big_val, 1, kv.rank)
            kv.row_sparse_pull(key_zeros, out=val, row_ids=np.array([], np.float32))
            kv.row_sparse_pull(key_big, out=big_val, row_ids=np.array([], np.float32))
            _check_diff(val, 0, kv.rank)
            _check_diff(big_val, 0, kv.rank)
        return True

    assert _on_dist_sync(rank_fn) == [True] * WORKERS


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_sync_push_pull_big_row_sparse_keys(dtype):
    """Ports ``dist_sync_kvstore.py::test_sync_push_pull``'s ``check_big_row_sparse_keys``:
    a 1200 x 1200 row-sparse key; rank ``r`` updates every ``2(r+1)``-th of a random
    30% of its rows; every rank pulls random rows (2-D row ids of ``dtype``) and sees
    every rank's updates."""
    key = "97" if dtype == "float32" else "98"
    rnd = np.random.RandomState(123)
    indices = np.argwhere(rnd.rand(BIG_SHAPE[0]) < 0.3).flatten()

    def rank_fn(kv):
        nworker = kv.num_workers
        update_rows = [indices[:: (r + 1) * 2] for r in range(nworker)]
        v = np.zeros(BIG_SHAPE, dtype)
        v[update_rows[kv.rank]] = kv.rank + 1
        for i in range(DIST_REPEAT):
            kv.push(key, sparse.cast_storage(v, "row_sparse"))
            row_ids_np = np.random.RandomState(kv.rank).randint(BIG_SHAPE[0], size=BIG_SHAPE[0])
            row_ids = row_ids_np.reshape(BIG_SHAPE[0] // 2, 2).astype(dtype)
            val = sparse.zeros("row_sparse", BIG_SHAPE, dtype=dtype)
            kv.row_sparse_pull(key, out=val, row_ids=row_ids)
            updated = np.ones(BIG_SHAPE)
            for r in range(nworker):
                updated[update_rows[r]] += (r + 1) * RATE * (i + 1)
            expected = np.zeros(BIG_SHAPE)
            expected[row_ids_np] = updated[row_ids_np]
            _check_diff(val, expected.astype(dtype), kv.rank)
        return True

    assert _on_dist_sync(rank_fn) == [True] * WORKERS


def test_invalid_operations_check_invalid_pull():
    """Ports ``dist_sync_kvstore.py::test_invalid_operations``'s ``check_invalid_pull``:
    with a row-sparse key 999, a pull of a key never initialised ('invalid_key') is
    refused (MXNet: ``MXNetError``; labkv: ``KeyError``, or ``TypeError`` for a str key
    in a store of int keys)."""

    def rank_fn(kv):
        kv.init(999, sparse.cast_storage(_ones((2, 2)), "row_sparse"))
        out = sparse.cast_storage(_ones((2, 2)), "row_sparse")
        with pytest.raises(TypeError, match="one store takes one kind of key"):
            kv.pull("invalid_key", out=out, ignore_sparse=False)
        with pytest.raises(KeyError, match="not initialised"):
            kv.pull(1000, out=out, ignore_sparse=False)
        return True

    with InProcessCluster("dist_sync", 2, 2) as c:
        assert in_threads(*[lambda kv=kv: rank_fn(kv) for kv in c.ranks]) == [True, True]


@pytest.mark.skip(
    reason="dist_sync_kvstore.py's check_invalid_gluon_trainer_reset tests that "
    "gluon.ParameterDict.load refuses to reset a store with update_on_kvstore=True: "
    "labkv has no gluon Parameters (labkv.torch's parameters are torch tensors, "
    "loaded by torch)"
)
def test_invalid_operations_check_invalid_gluon_trainer_reset():
    """Ports ``dist_sync_kvstore.py::test_invalid_operations``'s
    ``check_invalid_gluon_trainer_reset`` (skipped: see the reason)."""


def test_gluon_trainer_sparse_step():
    """Ports ``dist_sync_kvstore.py::test_gluon_trainer_sparse_step`` at the store's
    level (labkv has no gluon Trainer): a (2, 10) row-sparse weight of ones, SGD with
    rate 1 on the servers, each rank's gradient ``rank+1`` on every row: the weight is
    ``1 - (1+W)W/2``. (Through ``labkv.torch`` the ranks' gradients are averaged, as
    torch's DDP does, not summed: see the next test.)"""
    shape, all_rows = (2, 10), np.arange(2, dtype=np.float32)

    def rank_fn(kv):
        kv.set_optimizer("sgd", learning_rate=1.0)
        kv.init("x", sparse.cast_storage(_ones(shape), "row_sparse"))
        kv.push("x", sparse.cast_storage(_ones(shape) * (kv.rank + 1), "row_sparse"))
        out = sparse.zeros("row_sparse", shape)
        kv.row_sparse_pull("x", out=out, row_ids=all_rows)
        return out.asnumpy()

    with InProcessCluster("dist_sync", 2, WORKERS) as c:
        got = in_threads(*[lambda kv=kv: rank_fn(kv) for kv in c.ranks])
    expected = 1 - (1 + WORKERS) * WORKERS / 2
    for value in got:
        np.testing.assert_allclose(value, np.full(shape, expected))


def test_gluon_trainer_sparse_step_through_labkv_torch():
    """``dist_sync_kvstore.py::test_gluon_trainer_sparse_step`` through
    ``labkv.torch``: an ``nn.Embedding(2, 10, sparse=True)`` of ones, ``y = (rank+1)
    * sum(emb(all rows))``; the DistributedOptimizer averages the ranks' gradients
    (MXNet's ``Trainer.step(1)`` sums them), so the weight is ``1 - (1+W)/2``."""
    torch = pytest.importorskip("torch")
    import labkv.torch as lkt

    def rank_fn(kv):
        emb = torch.nn.Embedding(2, 10, sparse=True)
        with torch.no_grad():
            emb.weight.fill_(1.0)
        opt = lkt.DistributedOptimizer(
            torch.optim.SGD(emb.parameters(), lr=1.0), kv, sparse_params=emb
        )
        assert opt.update_on_kvstore  # None: MXNet's rule for sparse gradients on dist
        ((kv.rank + 1) * emb(torch.arange(2))).sum().backward()
        opt.step()
        # rows are pulled by the lookups that read them (MXNet's test reads them
        # with row_sparse_data(all_rows)): the state dict pulls the whole table
        return emb.state_dict()["weight"].numpy().copy()

    with InProcessCluster("dist_sync", 2, WORKERS) as c:
        got = in_threads(*[lambda kv=kv: rank_fn(kv) for kv in c.ranks])
    for value in got:
        np.testing.assert_allclose(value, np.full((2, 10), 1 - (1 + WORKERS) / 2))


# -- dist_sync_kvstore.py / dist_async_kvstore.py: test_gluon_trainer_type ------------------------
@pytest.mark.parametrize(
    ("kind", "sparse_grad", "update_on_kv", "expected"),
    [
        ("dist_sync", False, None, False),  # labkv.torch's default: torch steps (MXNet: True)
        ("dist_sync", False, True, True),
        ("dist_sync", False, False, False),
        ("dist_sync", True, None, True),
        ("dist_sync", True, False, ValueError),
        ("dist_sync", True, True, True),
        ("dist_async", False, False, ValueError),
        ("dist_async", False, True, True),
        ("dist_async", True, False, ValueError),
        ("dist_async", True, True, True),
        ("dist_async", True, None, True),
    ],
)
def test_gluon_trainer_type(kind, sparse_grad, update_on_kv, expected):
    """Ports ``test_gluon_trainer_type`` of ``dist_sync_kvstore.py`` and
    ``dist_async_kvstore.py`` to ``labkv.torch``: whether ``update_on_kvstore`` is
    taken, picked or refused, for dense and sparse gradients (MXNet's ``stype`` and
    ``grad_stype='row_sparse'``: torch's ``nn.Embedding(sparse=True)``, whose weight is
    dense and gradient sparse; a row-sparse *weight* has no torch form). One
    difference: with dense gradients and ``update_on_kvstore=None`` on dist_sync MXNet
    updates on the store, labkv.torch (Horovod's default) lets torch step; MXNet's
    dist_async ``None`` with dense gradients is the async refusal here (labkv.torch's
    default is ``False``, which dist_async refuses as MXNet does)."""
    torch = pytest.importorskip("torch")
    import labkv.torch as lkt

    with InProcessCluster(kind, 1, 1) as c:
        kv = c.ranks[0]
        emb = torch.nn.Embedding(10, 1, sparse=sparse_grad)
        make = lambda: lkt.DistributedOptimizer(  # noqa: E731
            torch.optim.SGD(emb.parameters(), lr=0.1), kv, update_on_kvstore=update_on_kv,
            sparse_params=emb,
        )  # fmt: skip
        if isinstance(expected, type):
            with pytest.raises(expected, match="update_on_kvstore"):
                make()
        else:
            assert make().update_on_kvstore is expected
