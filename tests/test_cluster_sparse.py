"""Row-sparse keys on the dist stores (``labkv/cluster/_rows``): the random programs of
``tests/test_sparse_mxnet.py`` on dist_sync and dist_async, 1 and 2 ranks, 1 and 2
servers, give the local store's values; only the rows touched travel (the servers'
byte counters); a killed primary with ``replicas=2`` changes no number. In-process
servers (``tests/_inprocess.py``) for all of these, the real ``LocalCluster`` for a few
(``@pytest.mark.slow``)."""

from __future__ import annotations

import numpy as np
import pytest

import labkv
import labkv.sparse as sparse
from tests._inprocess import InProcessCluster
from tests._waiting import in_threads
from tests.test_sparse_mxnet import PROGRAMS, rows_of

KEY = "e"


def _optimizer(kv, program):
    if program["optimizer"]:
        name, params = program["optimizer"]
        kv.set_optimizer(name, **params)


def _parts(op, shape, ranks):
    """The devices' gradients of a push, cut between ``ranks`` ranks in order (a rank
    without one pushes no rows)."""
    grads = [rows_of(g, shape) for g in op["grads"]]
    cuts = [r * len(grads) // ranks for r in range(ranks + 1)]
    parts = [grads[cuts[r] : cuts[r + 1]] for r in range(ranks)]
    return [p or [sparse.zeros("row_sparse", shape)] for p in parts]


def _pull(kv, shape, op):
    out = sparse.zeros("row_sparse", shape)
    kv.row_sparse_pull(KEY, out=out, row_ids=np.array(op["row_ids"]))
    return out


def _local_run(program, ranks, sync):
    """What the local store gives: a dist_sync round as one push of every rank's
    gradients, a dist_async push as one push per rank, rank 0's first."""
    shape = tuple(program["shape"])
    kv = labkv.create("local")
    _optimizer(kv, program)
    kv.init(KEY, rows_of(program["init"], shape))
    pulled = []
    for op in program["ops"]:
        if op["op"] == "pull":
            pulled.append(_pull(kv, shape, op))
            continue
        parts = _parts(op, shape, ranks)
        for grads in [[g for p in parts for g in p]] if sync else parts:
            kv.push(KEY, grads)
    return pulled


def _dist_run(c, program, sync):
    """Every rank of ``c`` runs ``program``: rank r pushes its part of each push (in
    dist_async one rank after the other, barriers between, and after each pull);
    their pulls."""
    shape = tuple(program["shape"])
    ranks = len(c.ranks)

    def rank(kv):
        _optimizer(kv, program)
        kv.init(KEY, rows_of(program["init"], shape))
        pulled = []
        for op in program["ops"]:
            if op["op"] == "pull":
                pulled.append(_pull(kv, shape, op))
                if not sync and ranks > 1:
                    kv.barrier()  # every rank has pulled before the next push
                continue
            grads = _parts(op, shape, ranks)[kv.rank]
            if sync:
                kv.push(KEY, grads)
                continue
            for turn in range(ranks):
                if turn == kv.rank:
                    kv.push(KEY, grads)
                if ranks > 1:
                    kv.barrier()
        return pulled

    return in_threads(*[lambda kv=kv: rank(kv) for kv in c.ranks], timeout=60)


def _same(got, want, exact):
    for a, b in zip(got, want, strict=True):
        assert a.indices.tolist() == b.indices.tolist()
        if exact:
            np.testing.assert_array_equal(a.data, b.data)
        else:  # the ranks' sums meet in another order than the local store's
            np.testing.assert_allclose(a.data, b.data, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("servers", [1, 2])
@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("kind", ["dist_sync", "dist_async", "dist_ssp"])
def test_the_random_programs_give_the_local_stores_values(kind, ranks, servers):
    sync, kw = kind == "dist_sync", {"staleness": 0} if kind == "dist_ssp" else {}
    for program in PROGRAMS:
        want = _local_run(program, ranks, sync)
        with InProcessCluster(kind, servers, ranks, timeout=10.0, **kw) as c:
            got = _dist_run(c, program, sync)
        for pulled in got:
            _same(pulled, want, exact=ranks == 1)


def test_a_row_sparse_key_is_cut_by_rows_over_every_server():
    with InProcessCluster("dist_sync", 2, 1) as c:
        kv = c.ranks[0]
        kv.init(KEY, sparse.zeros("row_sparse", (5, 3)))  # small: still sliced
        kv.init("d", np.zeros((5, 3), np.float32))
        assert [(p["start"], p["stop"]) for p in kv.placement()[KEY]] == [(0, 6), (6, 15)]
        assert len(kv.placement()["d"]) == 1
        assert isinstance(kv.pull(KEY), sparse.RowSparseArray)


def _bytes(kv):
    load = kv.server_load()
    return sum(s["bytes_in"] for s in load), sum(s["bytes_out"] for s in load)


def test_the_bytes_on_the_wire_grow_with_the_rows_touched_not_the_table():
    rows, width, touched = 10_000, 64, np.arange(0, 10_000, 1000)
    table = np.ones((rows, width), np.float32)
    with InProcessCluster("dist_sync", 2, 1, bigarray_bound=1000) as c:
        kv = c.ranks[0]
        kv.set_optimizer("sgd", learning_rate=0.1)
        kv.init([KEY, "dense"], [sparse.cast_storage(table, "row_sparse"), table])
        start = _bytes(kv)
        grad = sparse.row_sparse_array((np.ones((10, width), np.float32), touched), (rows, width))
        kv.push(KEY, grad)
        out = sparse.zeros("row_sparse", (rows, width))
        kv.row_sparse_pull(KEY, out=out, row_ids=touched)
        after_sparse = _bytes(kv)
        kv.push("dense", np.ones((rows, width), np.float32))
        kv.pull("dense", out=np.empty((rows, width), np.float32))
        after_dense = _bytes(kv)
        np.testing.assert_allclose(out.data, 0.9)
        assert out.indices.tolist() == touched.tolist()
    moved = [a - b for a, b in zip(after_sparse, start, strict=True)]
    dense = [a - b for a, b in zip(after_dense, after_sparse, strict=True)]
    assert moved[0] == 10 * width * 4 + 2 * 10 * 8  # the push's rows and theirs and the pull's ids
    assert moved[1] == 10 * width * 4  # the rows pulled
    assert dense[0] / moved[0] > 900 and dense[1] / moved[1] == 1000


def test_a_dense_keys_row_sparse_pull_reads_only_the_rows_sliced_or_not():
    value = np.arange(7 * 3, dtype=np.float32).reshape(7, 3)
    with InProcessCluster("dist_sync", 2, 1, bigarray_bound=10) as c:
        kv = c.ranks[0]
        kv.init(["cut", "whole"], [value, value[:2]])  # "cut": sliced inside row 3
        assert [p["stop"] for p in kv.placement()["cut"]] == [10, 21]
        for key, ids, shape in [("cut", [6, 3, 0], (7, 3)), ("whole", [1], (2, 3))]:
            before = _bytes(kv)[1]
            out = sparse.zeros("row_sparse", shape)
            kv.row_sparse_pull(key, out=out, row_ids=np.array(ids))
            assert out.indices.tolist() == sorted(ids)
            np.testing.assert_array_equal(out.data, value[sorted(ids)])
            assert _bytes(kv)[1] - before == len(ids) * 3 * 4
        dense = np.full((7, 3), 9.0, np.float32)
        kv.row_sparse_pull("cut", out=dense, row_ids=np.array([3]))
        np.testing.assert_array_equal(dense.sum(axis=1), [0, 0, 0, value[3].sum(), 0, 0, 0])


@pytest.mark.parametrize("servers", [1, 2])
@pytest.mark.parametrize("kind", ["dist_sync", "dist_async"])
def test_a_custom_updater_gets_the_row_sparse_merged_gradient_of_its_rows(kind, servers):
    def updater(key, grad, stored):  # runs on the server (sliced: on its rows)
        assert isinstance(grad, labkv.sparse.RowSparseArray) and grad.shape == stored.shape
        stored[grad.indices] += grad.data * len(grad.indices)

    ranks = 2 if kind == "dist_sync" else 1
    with InProcessCluster(kind, servers, ranks) as c:
        for kv in c.ranks:
            kv.init(KEY, sparse.zeros("row_sparse", (4, 2)))
            kv.set_updater(updater)
        rows = [[0, 2], [2]] if ranks == 2 else [[0, 2]]
        grads = [sparse.row_sparse_array((np.ones((len(r), 2)), r), shape=(4, 2)) for r in rows]
        in_threads(*[lambda kv=kv: kv.push(KEY, grads[kv.rank]) for kv in c.ranks])
        out = sparse.zeros("row_sparse", (4, 2))
        c.ranks[0].row_sparse_pull(KEY, out=out, row_ids=np.arange(4))
    merged = np.array([1, 0, 2, 0] if ranks == 2 else [1, 0, 1, 0])  # one merged gradient
    rows_here = 2 if servers == 1 else 1  # each server's rows of it
    np.testing.assert_array_equal(out.data[:, 0], merged * rows_here)


def test_compressed_row_sparse_pushes_and_dense_pushes_to_row_sparse_keys_are_refused():
    with InProcessCluster("dist_sync", 2, 1) as c:
        kv = c.ranks[0]
        kv.init(KEY, sparse.zeros("row_sparse", (4, 2)))
        kv.init("cut", np.zeros(2000, np.float32).reshape(1000, 2))
        before = kv.server_load()
        with pytest.raises(TypeError, match="holds a row_sparse value"):
            kv.push(KEY, np.ones((4, 2), np.float32))
        with pytest.raises(ValueError, match="sliced over the servers by elements"):
            kv.push("cut", sparse.zeros("row_sparse", (1000, 2)))
        kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
        with pytest.raises(ValueError, match="Gradient compression for row sparse"):
            kv.push(KEY, sparse.zeros("row_sparse", (4, 2)))
        assert kv.server_load() == before


def _train(c, steps, kill_at=None):
    """The ranks of ``c`` train SGD with momentum (lazy) on a row-sparse key sliced
    over both servers; the primary of server 0 dies after ``kill_at`` steps."""
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
            kv.push(KEY, sparse.row_sparse_array((data, rows), shape=shape))
            out = sparse.zeros("row_sparse", shape)
            kv.row_sparse_pull(KEY, out=out, row_ids=np.arange(shape[0]))
        return out.data

    return in_threads(*[lambda kv=kv: loop(kv) for kv in c.ranks])[0], c.ranks[0].peek(KEY)


@pytest.mark.parametrize("kind", ["dist_sync", "dist_async"])
def test_a_killed_primary_with_replicas_changes_no_number(kind):
    ranks = 2 if kind == "dist_sync" else 1  # one rank pushing as it goes: one order
    with InProcessCluster(kind, 2, ranks, timeout=5.0) as c:
        undisturbed = _train(c, 10)
    with InProcessCluster(kind, 2, ranks, timeout=5.0, replicas=2) as c:
        replicated = _train(c, 10, kill_at=4)
        assert c.group.servers_by_name(0)[0].primary  # the backup took over
    for a, b in zip(replicated, undisturbed, strict=True):
        np.testing.assert_array_equal(a, b)


# -- the real LocalCluster ---------------------------------------------------------------------


def _program_on_rank(kv, program, sync):
    """One rank's share of ``program`` (see ``_dist_run``), on a Dask worker."""
    shape = tuple(program["shape"])
    _optimizer(kv, program)
    kv.init(KEY, rows_of(program["init"], shape))
    pulled = []
    for op in program["ops"]:
        if op["op"] == "pull":
            out = _pull(kv, shape, op)
            pulled.append((out.indices, out.data))
            if not sync:
                kv.barrier()
            continue
        grads = _parts(op, shape, kv.num_workers)[kv.rank]
        for turn in range(1 if sync else kv.num_workers):
            if sync or turn == kv.rank:
                kv.push(KEY, grads)
            if not sync:
                kv.barrier()
    return pulled


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dist_sync", "dist_async"])
def test_the_random_programs_on_a_real_cluster_give_the_local_stores_values(handle, kind):
    from labkv.cluster import run

    sync = kind == "dist_sync"
    for program in PROGRAMS[:6]:
        want = _local_run(program, 2, sync)
        args = (program, sync)
        results = run(_program_on_rank, 2, kind, num_servers=2, cluster=handle, args=args)
        for pulled in results:
            for (rows, data), b in zip(pulled, want, strict=True):
                assert rows.tolist() == b.indices.tolist()
                np.testing.assert_allclose(data, b.data, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_the_notebooks_store_moves_only_the_rows_on_a_real_cluster(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2)
    try:
        kv.init(KEY, sparse.zeros("row_sparse", (10_000, 64)))
        before = _bytes(kv)
        rows = np.arange(0, 10_000, 1000)
        kv.push(KEY, sparse.row_sparse_array((np.ones((10, 64), np.float32), rows), (10_000, 64)))
        out = sparse.zeros("row_sparse", (10_000, 64))
        kv.row_sparse_pull(KEY, out=out, row_ids=rows)
        moved = [a - b for a, b in zip(_bytes(kv), before, strict=True)]
        np.testing.assert_array_equal(out.data, 1.0)
        assert moved == [10 * 64 * 4 + 2 * 80, 10 * 64 * 4]
    finally:
        kv.close()
