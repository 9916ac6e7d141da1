"""A row-sparse key with fewer rows than servers (1 or 2 rows over 3 or 4 servers):
some servers hold no rows of it (an empty piece, :func:`labkv.cluster._rows.row_placement.place_rows`)
and every call still works: init, push (with rows, and with none), ``row_sparse_pull``
(of every row, some, none), a dense ``pull``, the optimizer states' save and load, and
a replicated group. Checked against the local store's numbers."""

from __future__ import annotations

import numpy as np
import pytest

import labkv
import labkv.sparse as sparse
from labkv.cluster._rows.row_placement import place_rows
from tests._inprocess import InProcessCluster
from tests._waiting import in_threads

WIDTH = 3


def _table(rows: int) -> np.ndarray:
    return np.arange(1, rows * WIDTH + 1, dtype=np.float32).reshape(rows, WIDTH)


def _grad(rank: int, rows: int) -> sparse.RowSparseArray:
    """Rank ``rank``'s gradient: its own row (the last one when there are fewer)."""
    row = min(rank, rows - 1)
    return sparse.row_sparse_array(
        (np.full((1, WIDTH), rank + 1.0, np.float32), [row]), shape=(rows, WIDTH)
    )


def _steps(kv, rows: int, ranks: int, sync: bool) -> list[np.ndarray]:
    """Two pushes per rank (the second with no rows), pulls of every row, of the last
    row, of none, and a dense pull; in dist_async the ranks take turns."""
    got = []
    for grad in (_grad(kv.rank, rows), sparse.zeros("row_sparse", (rows, WIDTH))):
        if sync:
            kv.push("e", grad)
        else:
            for turn in range(ranks):
                if turn == kv.rank:
                    kv.push("e", grad)
                if ranks > 1:
                    kv.barrier()
        for ids in (np.arange(rows), np.array([rows - 1]), np.zeros(0, np.int64)):
            out = sparse.zeros("row_sparse", (rows, WIDTH))
            kv.row_sparse_pull("e", out=out, row_ids=ids)
            assert out.indices.tolist() == ids.tolist()
            got.append(out.asnumpy())
        dense = np.full((rows, WIDTH), -1.0, np.float32)
        kv.pull("e", out=dense)
        got.append(dense)
        assert isinstance(kv.pull("e"), sparse.RowSparseArray)
    return got


def _local(rows: int, ranks: int, sync: bool) -> list[np.ndarray]:
    kv = labkv.create("local")
    kv.set_optimizer("adam", learning_rate=0.1)
    kv.init("e", sparse.cast_storage(_table(rows), "row_sparse"))
    got = []
    for grads in ([_grad(r, rows) for r in range(ranks)], [sparse.zeros("row_sparse", (rows, 3))]):
        for push in [grads] if sync else [[g] for g in grads]:
            kv.push("e", push)
        for ids in (np.arange(rows), np.array([rows - 1]), np.zeros(0, np.int64)):
            out = sparse.zeros("row_sparse", (rows, WIDTH))
            kv.row_sparse_pull("e", out=out, row_ids=ids)
            got.append(out.asnumpy())
        got.append(kv.pull("e").asnumpy())
    return got


@pytest.mark.parametrize(("servers", "rows"), [(3, 1), (4, 1), (3, 2), (4, 2)])
@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("kind", ["dist_sync", "dist_async"])
def test_a_key_with_fewer_rows_than_servers_works(kind, ranks, servers, rows, tmp_path):
    sync = kind == "dist_sync"
    empty = [p for p in place_rows((rows, WIDTH), servers) if p.start == p.stop]
    assert len(empty) == servers - rows  # some servers hold none of its rows
    with InProcessCluster(kind, servers, ranks, timeout=10.0) as c:

        def rank(kv):
            kv.set_optimizer("adam", learning_rate=0.1)
            kv.init("e", sparse.cast_storage(_table(rows), "row_sparse"))
            return _steps(kv, rows, ranks, sync)

        got = in_threads(*[lambda kv=kv: rank(kv) for kv in c.ranks], timeout=60)
        kv = c.ranks[0]
        assert [(p["start"], p["stop"]) for p in kv.placement()["e"]] == [
            (p.start, p.stop) for p in place_rows((rows, WIDTH), servers)
        ]
        path = tmp_path / "states"
        kv.save_optimizer_states(str(path))
        kv.load_optimizer_states(str(path))
        after = kv.pull("e").asnumpy()
    want = _local(rows, ranks, sync)
    for per_rank in got:
        for a, b in zip(per_rank, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(after, got[0][-1])


def test_an_all_zero_init_and_a_one_row_table_over_four_replicated_servers():
    with InProcessCluster("dist_sync", 4, 2, replicas=2, timeout=10.0) as c:

        def rank(kv):
            kv.set_optimizer("sgd", learning_rate=0.5)
            kv.init("e", sparse.zeros("row_sparse", (1, WIDTH)))
            kv.push("e", _grad(kv.rank, 1))
            out = sparse.zeros("row_sparse", (1, WIDTH))
            kv.row_sparse_pull("e", out=out, row_ids=np.array([0]))
            return out.asnumpy()

        got = in_threads(*[lambda kv=kv: rank(kv) for kv in c.ranks], timeout=60)
    for value in got:
        np.testing.assert_allclose(value, np.full((1, WIDTH), -0.5 * 3))  # the sum of 1 and 2


@pytest.mark.parametrize("servers", [2, 3])
def test_a_dense_pull_of_a_row_sparse_key_with_many_rows_per_server(servers):
    # Each server's piece is (rows, width): a C-contiguous dense out takes it flat.
    table = _table(50)
    with InProcessCluster("dist_sync", servers, 1) as c:
        kv = c.ranks[0]
        kv.init("e", sparse.cast_storage(table, "row_sparse"))
        out = np.zeros_like(table)
        kv.pull("e", out=out)
        np.testing.assert_array_equal(out, table)
        strided = np.zeros((50, 2 * WIDTH), np.float32)[:, ::2]  # not contiguous
        kv.pull("e", out=strided)
        np.testing.assert_array_equal(strided, table)
