"""Row-sparse keys on GPU servers (``server_device='gpu'``), on the strict CuPy stand-in
(``tests/gpu_standin``: 2 simulated GPUs; an operand or an index array on another
device, or an implicit host conversion, raises). In-process servers
(``tests/_inprocess.py``) on one event-loop thread, whose current GPU is 0: server
``s`` of two keeps its rows on ``gpu(s)``, a lone server on ``gpu(1)``, so every
operation of a server must make its own GPU current first.

The random programs of ``tests/test_sparse_mxnet.py`` (init, pushes of 1-4 devices,
``row_sparse_pull``; SGD lazy and not, momentum, wd, Adam) on dist_sync and
dist_async, 1 and 2 ranks, 1 and 2 GPU servers, with gradients as CuPy arrays on the
ranks' GPUs (one push per device) or on the host, pulled into CuPy outs on either GPU
and into host outs, give the local store's values; the lazy rule on GPU servers;
their optimizer states save and load (into GPU and host servers); a killed GPU
primary with ``replicas=2`` changes no number."""

from __future__ import annotations

import numpy as np
import pytest

import labkv
import labkv.sparse as sparse
from labkv.devices import device_of
from tests._inprocess import InProcessCluster
from tests._standin import standin_cupy
from tests._waiting import in_threads
from tests.test_cluster_sparse import _local_run, _parts
from tests.test_sparse_mxnet import PROGRAMS, rows_of

KEY = "e"


@pytest.fixture(scope="module", autouse=True)
def cp():
    with standin_cupy(physical=2) as module:
        yield module


def _gpu_servers(kind, servers, ranks, **kw):
    """In-process GPU servers: two on gpu(0) and gpu(1), or one on gpu(1)."""
    device = "gpu" if servers == 2 else "gpu(1)"
    return InProcessCluster(kind, servers, ranks, server_device=device, **kw)


def _server_devices(c):
    return [labkv.gpu(s) for s in range(len(c.servers))] if len(c.servers) == 2 else [labkv.gpu(1)]


def _on_gpus(grads, first):
    """Each device's gradient on its own GPU, ``gpu(first)``, then the other."""
    return [g.to_device(labkv.gpu((first + i) % 2)) for i, g in enumerate(grads)]


def _optimizer(kv, program):
    if program["optimizer"]:
        name, params = program["optimizer"]
        kv.set_optimizer(name, **params)


def _assert_on_gpu(array, device):
    import cupy

    assert isinstance(array, cupy.ndarray), type(array)
    assert device_of(array) == device


def _pull_into(kv, shape, row_ids, turn):
    """A ``row_sparse_pull`` of ``row_ids`` into an out of the ``turn``-th kind: a
    row-sparse out with its data on gpu(1) and one on gpu(0) (each with its own rows,
    in one pull), a host row-sparse out, or a dense CuPy out on gpu(1); returned as
    host row-sparse values, the outs' devices checked."""
    kind = turn % 3
    if kind == 0:
        outs = [sparse.zeros("row_sparse", shape, device=labkv.gpu(i)) for i in (1, 0)]
        ids = [row_ids, row_ids[::2]]  # another set of rows for the out on gpu(0)
        kv.row_sparse_pull(KEY, out=outs, row_ids=ids)
        for out, i in zip(outs, (1, 0), strict=True):
            _assert_on_gpu(out.data, labkv.gpu(i))
        want = sparse.zeros("row_sparse", shape)
        kv.row_sparse_pull(KEY, out=want, row_ids=ids[1])  # the second out's rows, on the host
        got = outs[1].to_device(labkv.cpu(0))
        assert got.indices.tolist() == want.indices.tolist()
        np.testing.assert_array_equal(got.data, want.data)
        return outs[0].to_device(labkv.cpu(0))
    if kind == 1:
        out = sparse.zeros("row_sparse", shape)
        kv.row_sparse_pull(KEY, out=out, row_ids=row_ids)
        assert isinstance(out.data, np.ndarray)
        return out
    out = labkv.full(shape, 7.0, device=labkv.gpu(1))
    kv.row_sparse_pull(KEY, out=out, row_ids=row_ids)
    _assert_on_gpu(out, labkv.gpu(1))
    host = out.get()
    rows = np.unique(row_ids)
    others = np.setdiff1d(np.arange(shape[0]), rows)
    np.testing.assert_array_equal(host[others], 0.0)  # the rows not asked for are zeroed
    return sparse.row_sparse_array((host[rows], rows), shape=shape)


def _gpu_run(c, program, sync):
    """Every rank of ``c`` runs ``program`` (as ``tests/test_cluster_sparse._dist_run``):
    rank 0 inits and pushes CuPy values on its GPUs, rank 1 host values; each pull
    goes into another kind of out (:func:`_pull_into`)."""
    shape = tuple(program["shape"])
    ranks = len(c.ranks)

    def rank(kv):
        on_gpu = kv.rank == 0
        _optimizer(kv, program)
        init = rows_of(program["init"], shape)
        kv.init(KEY, init.to_device(labkv.gpu(1)) if on_gpu else init)
        pulled = []
        for op in program["ops"]:
            if op["op"] == "pull":
                turn = len(pulled) + kv.rank
                pulled.append(_pull_into(kv, shape, np.array(op["row_ids"]), turn))
                if not sync and ranks > 1:
                    kv.barrier()
                continue
            grads = _parts(op, shape, ranks)[kv.rank]
            if on_gpu:
                grads = _on_gpus(grads, first=len(pulled) % 2)
            for turn in range(1 if sync else ranks):
                if sync or turn == kv.rank:
                    kv.push(KEY, grads)
                if not sync and ranks > 1:
                    kv.barrier()
        return pulled

    return in_threads(*[lambda kv=kv: rank(kv) for kv in c.ranks], timeout=60)


def _assert_kept_on_their_gpus(c):
    """Each server's piece of the key and its optimizer states are CuPy arrays on
    the server's GPU; the placement names the GPUs."""
    devices = _server_devices(c)
    for server, device in zip(c.servers, devices, strict=True):
        assert server.device == device
        _assert_on_gpu(server.shard.values[KEY], device)
        for state in server.shard.states.get(KEY, ()):
            _assert_on_gpu(state, device)
    placed = c.ranks[0].placement()[KEY]
    assert [p["device"].split(" ")[0] for p in placed] == [str(d) for d in devices]


@pytest.mark.parametrize("servers", [1, 2])
@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("kind", ["dist_sync", "dist_async", "dist_ssp"])
def test_the_random_programs_on_gpu_servers_give_the_local_stores_values(kind, ranks, servers):
    sync, kw = kind == "dist_sync", {"staleness": 0} if kind == "dist_ssp" else {}
    for number, program in enumerate(PROGRAMS):
        want = _local_run(program, ranks, sync)
        with _gpu_servers(kind, servers, ranks, timeout=10.0, **kw) as c:
            got = _gpu_run(c, program, sync)
            _assert_kept_on_their_gpus(c)
        for pulled in got:
            assert len(pulled) == len(want)
            for a, b in zip(pulled, want, strict=True):
                assert a.indices.tolist() == b.indices.tolist(), number
                np.testing.assert_allclose(a.data, b.data, rtol=1e-5, atol=1e-6, err_msg=number)


def test_a_dist_device_sync_rank_sums_its_gpus_rows_for_gpu_servers():
    shape = (8, 2)
    rows = [[0, 5], [5, 7]]  # one device each; row 5 in both
    with _gpu_servers("dist_device_sync", 2, 2) as c:
        for kv in c.ranks:
            kv.init(KEY, sparse.zeros("row_sparse", shape))

        def push(kv):
            grads = [
                sparse.row_sparse_array((np.full((2, 2), kv.rank + 1.0, np.float32), r), shape)
                for r in rows
            ]
            kv.push(KEY, _on_gpus(grads, first=kv.rank))
            out = sparse.zeros("row_sparse", shape, device=labkv.gpu(1 - kv.rank))
            kv.row_sparse_pull(KEY, out=out, row_ids=np.arange(8))
            return out

        outs = in_threads(*[lambda kv=kv: push(kv) for kv in c.ranks])
        _assert_kept_on_their_gpus(c)
        for out, r in zip(outs, [0, 1], strict=True):
            _assert_on_gpu(out.data, labkv.gpu(1 - r))
            # no updater: the value becomes the round's sum, the rows pushed alone
            assert out.indices.tolist() == list(range(8))
            np.testing.assert_array_equal(out.data.get()[:, 0], [3, 0, 0, 0, 0, 6, 0, 3])


@pytest.mark.parametrize("lazy", [True, False])
@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_gpu_servers_update_only_the_rows_pushed_when_lazy(name, lazy):
    shape, pushed = (10, 3), np.array([1, 4, 8])
    params = {"learning_rate": 0.1, "wd": 0.1, "lazy_update": lazy}
    if name == "sgd":
        params["momentum"] = 0.9
    results = {}
    for device in ("cpu", "gpu"):
        with InProcessCluster("dist_sync", 2, 1, server_device=device) as c:
            kv = c.ranks[0]
            kv.init(KEY, sparse.cast_storage(np.ones(shape, np.float32), "row_sparse"))
            kv.set_optimizer(name, **params)
            data = np.arange(1.0, 10.0, dtype=np.float32).reshape(3, 3)
            grad = sparse.row_sparse_array((data, pushed), shape=shape)
            for _ in range(2):
                kv.push(KEY, grad.to_device(labkv.gpu(1)) if device == "gpu" else grad)
            out = sparse.zeros("row_sparse", shape, device=labkv.gpu(0))
            kv.row_sparse_pull(KEY, out=out, row_ids=np.arange(10))
            results[device] = out.data.get()
            if device == "gpu":
                for s, server in enumerate(c.servers):
                    _assert_on_gpu(server.shard.values[KEY], labkv.gpu(s))
                    for state in server.shard.states[KEY]:
                        _assert_on_gpu(state, labkv.gpu(s))
    np.testing.assert_allclose(results["gpu"], results["cpu"], rtol=1e-6)
    untouched = np.setdiff1d(np.arange(10), pushed)
    assert (results["gpu"][pushed] < 1).all()
    if lazy:  # MXNet's lazy rule: wd and momentum leave the rows not pushed alone
        np.testing.assert_array_equal(results["gpu"][untouched], 1.0)
    else:
        assert (results["gpu"][untouched] < 1).all()


@pytest.mark.parametrize("servers", [1, 2])
def test_a_custom_updater_on_gpu_servers_gets_the_merged_rows_on_the_servers_gpu(servers):
    def updater(key, grad, stored):  # runs on the server: CuPy only, on the stored GPU
        import cupy

        assert isinstance(grad, labkv.sparse.RowSparseArray) and grad.shape == stored.shape
        assert isinstance(grad.data, cupy.ndarray) and isinstance(stored, cupy.ndarray)
        assert grad.data.device == stored.device
        stored[grad.indices] += grad.data * len(grad.indices)

    shape = (4, 2)
    with _gpu_servers("dist_sync", servers, 2) as c:
        for kv in c.ranks:
            kv.init(KEY, sparse.zeros("row_sparse", shape))
            kv.set_updater(updater)
        rows = [[0, 2], [2]]

        def push(kv):
            grad = sparse.row_sparse_array((np.ones((len(rows[kv.rank]), 2)), rows[kv.rank]), shape)
            kv.push(KEY, grad.to_device(labkv.gpu(1)) if kv.rank == 0 else grad)

        in_threads(*[lambda kv=kv: push(kv) for kv in c.ranks])
        out = sparse.zeros("row_sparse", shape, device=labkv.gpu(0))
        c.ranks[0].row_sparse_pull(KEY, out=out, row_ids=np.arange(4))
        _assert_kept_on_their_gpus(c)
    rows_here = 2 if servers == 1 else 1  # each server's rows of the one merged gradient
    np.testing.assert_array_equal(out.data.get()[:, 0], np.array([1, 0, 2, 0]) * rows_here)


def _steps(kv, shape, steps, seed, on_gpu):
    for step in range(steps):
        rng = np.random.default_rng(seed + step)
        rows = np.sort(rng.choice(shape[0], 4, replace=False))
        data = rng.standard_normal((4, shape[1])).astype(np.float32)
        grad = sparse.row_sparse_array((data, rows), shape=shape)
        kv.push(KEY, grad.to_device(labkv.gpu(step % 2)) if on_gpu else grad)
    out = sparse.zeros("row_sparse", shape)
    kv.row_sparse_pull(KEY, out=out, row_ids=np.arange(shape[0]))
    return out.data


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_gpu_servers_optimizer_states_of_a_row_sparse_key_save_and_load(name, tmp_path):
    shape, path = (12, 2), tmp_path / "states"
    params = {"learning_rate": 0.05, "wd": 0.01}
    if name == "sgd":
        params["momentum"] = 0.9
    with _gpu_servers("dist_sync", 2, 1) as c:
        kv = c.ranks[0]
        kv.init(KEY, sparse.cast_storage(np.ones(shape, np.float32), "row_sparse"))
        kv.set_optimizer(name, **params)
        weight = _steps(kv, shape, 3, seed=0, on_gpu=True)
        kv.save_optimizer_states(str(path))
        want = _steps(kv, shape, 2, seed=10, on_gpu=True)
    for device in ("gpu", "cpu", None):  # GPU servers, host servers, and no states loaded
        with InProcessCluster("dist_sync", 2, 1, server_device=device or "gpu") as c:
            kv = c.ranks[0]
            kv.init(KEY, sparse.cast_storage(weight, "row_sparse"))
            kv.set_optimizer(name, **params)
            if device is not None:
                kv.load_optimizer_states(str(path))
            if device == "gpu":
                for s, server in enumerate(c.servers):
                    for state in server.shard.states[KEY]:
                        _assert_on_gpu(state, labkv.gpu(s))
            got = _steps(kv, shape, 2, seed=10, on_gpu=device == "gpu")
        if device is None:  # the states matter: without them the steps differ
            assert not np.allclose(got, want, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    local = labkv.create("local")  # the GPU servers' states load into a local store too
    local.init(KEY, sparse.cast_storage(weight, "row_sparse"))
    local.set_optimizer(name, **params)
    local.load_optimizer_states(str(path))
    np.testing.assert_allclose(_steps(local, shape, 2, seed=10, on_gpu=True), want, rtol=1e-5)


def _train(c, steps, kill_at=None):
    """The ranks of ``c`` train lazy SGD with momentum on a row-sparse key cut over both
    GPU servers, rank 0 from its GPUs, rank 1 from the host; the primary of server 0
    dies after ``kill_at`` steps."""
    shape = (40, 3)
    for kv in c.ranks:
        kv.init(KEY, sparse.cast_storage(np.ones(shape, np.float32), "row_sparse"))
        kv.set_optimizer("sgd", learning_rate=0.1, momentum=0.9, wd=0.01)

    def loop(kv):
        for step in range(steps):
            if step == kill_at and kv.rank == 0:
                c.group.kill(0)
            rng = np.random.default_rng(100 * step + kv.rank)
            rows = np.sort(rng.choice(shape[0], 5, replace=False))
            data = rng.standard_normal((5, 3)).astype(np.float32)
            grad = sparse.row_sparse_array((data, rows), shape=shape)
            kv.push(KEY, grad.to_device(labkv.gpu(step % 2)) if kv.rank == 0 else grad)
            out = sparse.zeros("row_sparse", shape, device=labkv.gpu(1))
            kv.row_sparse_pull(KEY, out=out, row_ids=np.arange(shape[0]))
        return out.data.get()

    return in_threads(*[lambda kv=kv: loop(kv) for kv in c.ranks])


@pytest.mark.parametrize("kind", ["dist_sync", "dist_async"])
def test_a_killed_gpu_primary_with_replicas_changes_no_number(kind):
    ranks = 2 if kind == "dist_sync" else 1
    with _gpu_servers(kind, 2, ranks, timeout=5.0) as c:
        undisturbed = _train(c, 10)
    with _gpu_servers(kind, 2, ranks, timeout=5.0, replicas=2) as c:
        replicated = _train(c, 10, kill_at=4)
        (survivor,) = c.group.servers_by_name(0)
        assert survivor.primary  # the backup took over
        for s in range(2):  # every live replica keeps its rows and states on its GPU
            for server in c.group.servers_by_name(s):
                _assert_on_gpu(server.shard.values[KEY], labkv.gpu(s))
                for state in server.shard.states[KEY]:
                    _assert_on_gpu(state, labkv.gpu(s))
        primary, backup = c.group.servers_by_name(1)
        np.testing.assert_array_equal(
            backup.shard.values[KEY].get(), primary.shard.values[KEY].get()
        )
    assert not np.array_equal(undisturbed[0], np.ones((40, 3), np.float32))  # it trained
    for a, b in zip(replicated, undisturbed, strict=True):
        np.testing.assert_array_equal(a, b)


# -- the real LocalCluster of stand-in GPU workers ---------------------------------------------


def _push_rows_from_gpus(kv, shape, rows):
    """On a stand-in GPU worker: push one row-sparse gradient per GPU, pull the rows
    pushed into a row-sparse out on gpu(1) and a dense one on gpu(0)."""
    grads = [
        sparse.row_sparse_array((np.full((len(r), shape[1]), kv.rank + 1.0, np.float32), r), shape)
        for r in rows
    ]
    kv.push(KEY, [g.to_device(labkv.gpu(i)) for i, g in enumerate(grads)])
    wanted = np.unique(np.concatenate(rows))
    out = sparse.zeros("row_sparse", shape, device=labkv.gpu(1))
    dense = labkv.zeros(shape, device=labkv.gpu(0))
    kv.row_sparse_pull(KEY, out=[out, dense], row_ids=[wanted, wanted])
    devices = [str(labkv.device_of(out.data)), str(labkv.device_of(dense))]
    return devices, out.indices, out.data.get(), dense.get()


@pytest.mark.slow
def test_row_sparse_keys_on_gpu_servers_of_a_real_cluster(standin_handle):
    from labkv.cluster import run

    shape, rows = (1000, 8), [np.array([3, 600]), np.array([600, 999])]
    kv = labkv.create("dist_sync", cluster=standin_handle, num_servers=2, server_device="gpu")
    try:
        kv.init(KEY, sparse.zeros("row_sparse", shape))
        placed = kv.placement()[KEY]
        assert len(placed) == 2 and all(p["device"].startswith("gpu(0) pci:") for p in placed)
        assert len({p["device"] for p in placed}) == 2  # two workers: two physical GPUs
        before = [s["bytes_in"] for s in kv.server_load()]
        results = run(_push_rows_from_gpus, 2, kvstore=kv, args=(shape, rows))
        moved = [s["bytes_in"] - b for s, b in zip(kv.server_load(), before, strict=True)]
    finally:
        kv.close()
    expected = np.zeros(shape, np.float32)
    expected[[3, 999]] = 3.0  # each rank's 1 or 2, summed over the ranks
    expected[600] = 6.0  # and over both devices
    for devices, indices, data, dense in results:
        assert devices == ["gpu(1)", "gpu(0)"]
        assert indices.tolist() == [3, 600, 999]
        np.testing.assert_array_equal(data, expected[[3, 600, 999]])
        np.testing.assert_array_equal(dense, expected)
    # only the rows travel: server 0 gets row 3 from each rank, server 1 rows 600 and 999
    row = 8 * 4 + 8  # a row's data and its id
    assert moved == [2 * row + 2 * 8, 2 * 2 * row + 2 * 2 * 8]
