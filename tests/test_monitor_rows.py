"""Rows touched by row-sparse keys in the monitor (issue 28): push and pull events
of row-sparse values carry the rows moved (``extra["rows"]``), the calls only
counted sum them exactly as they sum bytes, a dist store's ``row_sparse_pull``
is a pull event, and the keys table shows rows per push and pull."""

from __future__ import annotations

import numpy as np
import pytest

import labkv
import labkv.sparse as sparse
from labkv.events import Event, EventBus, compact_rows
from labkv.widgets import MonitorModel
from labkv.widgets._render.tables import keys_table
from tests._inprocess import InProcessCluster

ROWS, WIDTH, CALLS = 100, 4, 25


def _grad(start: int, n: int) -> sparse.RowSparseArray:
    rows = np.arange(start, start + n) % ROWS
    return sparse.row_sparse_array((np.ones((n, WIDTH), np.float32), np.sort(rows)), (ROWS, WIDTH))


def _run(kv, calls: int = CALLS) -> tuple[int, int]:
    """``calls`` pushes of 3 rows from 2 devices and row_sparse_pulls of 5 rows of
    "e"; returns the rows pushed and pulled."""
    pushed = pulled = 0
    for i in range(calls):
        kv.push("e", [_grad(i, 3), _grad(i + 50, 3)])
        out = sparse.zeros("row_sparse", (ROWS, WIDTH))
        kv.row_sparse_pull("e", out=out, row_ids=np.arange(i, i + 5))
        pushed, pulled = pushed + 6, pulled + 5
    return pushed, pulled


def _column(model, key):
    headers, rows = keys_table(model)
    row = next(r for r in rows if r[0] == key)
    return dict(zip(headers, row, strict=True))


@pytest.mark.parametrize("detail", [0.0, 60.0])
def test_the_local_stores_rows_are_exact_in_detail_and_counted(detail):
    kv = labkv.create("local")
    model, events = MonitorModel(), []
    subs = [kv.events.subscribe(f, detail_interval=detail) for f in (model.on_event, events.append)]
    kv.init(["e", "d"], [sparse.zeros("row_sparse", (ROWS, WIDTH), dtype="float32"), np.zeros(3)])
    pushed, pulled = _run(kv)
    kv.push("d", np.ones(3))
    kv.events.flush()
    model.flush()
    stats = model.keys["e"]
    assert (stats.pushes, stats.pulls) == (CALLS, CALLS)
    assert (stats.rows_in, stats.rows_out) == (pushed, pulled)
    assert stats.bytes_out == CALLS * (5 * WIDTH * 4 + 5 * 8)  # the rows and their ids
    assert stats.shape == (ROWS, WIDTH)  # a pull's rows are not the key's shape
    detailed = [e for e in events if e.op in ("push", "pull") and not e.tally and e.key == "e"]
    assert all(e.extra["rows"] == (6 if e.op == "push" else 5) * e.count for e in detailed)
    tallied = sum(e.extra.get("rows", 0) for e in events if e.tally)
    assert sum(e.extra["rows"] for e in detailed) + tallied == pushed + pulled
    if detail:
        assert tallied > 0 and len(detailed) < 2 * CALLS  # most calls only counted
    assert _column(model, "e")["rows per push / pull"] == "6 / 5"
    assert _column(model, "d")["rows per push / pull"] == "-"
    assert "rows" not in next(e for e in events if e.key == "d" and e.op == "push").extra
    for sub in subs:
        sub.unsubscribe()


def test_a_dense_stores_keys_table_has_no_rows_column():
    kv = labkv.create("local")
    model = MonitorModel()
    sub = kv.events.subscribe(model.on_event)
    kv.init("w", np.zeros(3))
    kv.push("w", np.ones(3))
    model.flush()
    assert "rows per push / pull" not in keys_table(model)[0]
    sub.unsubscribe()


def test_a_record_of_many_counted_keys_carries_their_rows():
    bus, got = EventBus("s"), []
    bus.subscribe(got.append, detail_interval=60.0)
    for key in range(20):
        for _ in range(3):
            counted = bus.admit_rows("pull", key, 80, key + 1)
            if counted:  # a detailed event, as a store emits it
                count, nbytes, rows = counted
                bus.emit("pull", key, count=count, nbytes=nbytes, extra={"rows": rows})
    bus.flush()
    (record,) = [e for e in got if e.tally]
    assert record.key is None and len(compact_rows(record)) == 20
    model = MonitorModel()
    for e in got:
        model.on_event(e)
    model.flush()
    # the first call of the first 4 keys was detailed: every call's rows counted once
    assert [model.keys[k].rows_out for k in range(20)] == [3 * (k + 1) for k in range(20)]


def test_a_dist_stores_row_sparse_pull_is_a_pull_event_with_its_rows():
    with InProcessCluster("dist_sync", 2, 1) as c:
        kv = c.ranks[0]
        events, model = [], MonitorModel()
        for f in (events.append, model.on_event):
            kv.events.subscribe(f, detail_interval=60.0)
        kv.init("e", sparse.zeros("row_sparse", (ROWS, WIDTH), dtype="float32"))
        pushed, pulled = _run(kv)
        kv.events.flush()
    pulls = [e for e in events if e.op == "pull"]
    assert pulls and not pulls[0].tally and pulls[0].extra["rows"] == 5
    assert sum(e.count for e in pulls) == CALLS
    assert sum(e.extra["rows"] for e in pulls) == pulled
    assert sum(e.nbytes for e in pulls) == CALLS * (5 * WIDTH * 4 + 5 * 8)
    pushes = [e for e in events if e.op == "push" and e.server is None]
    assert sum(e.extra["rows"] for e in pushes) == pushed
    model.flush()
    stats = model.keys["e"]
    assert (stats.pulls, stats.rows_out, stats.sparse) == (CALLS, pulled, True)


def test_on_a_cluster_the_ranks_give_the_rows_and_the_servers_the_counts():
    """A dist rank's push event gives its rows; its servers' receipts (one per slice,
    each a row-sparse piece with rows of its own) count the push once and add no rows."""
    model = MonitorModel()
    rsp = {"stype": "row_sparse"}
    model.on_event(Event(0, 1.0, "dist_sync-x", "init", "e", shape=(8, 2), extra=dict(rsp)))
    for rank in range(3):
        model.on_event(
            Event(0, 1.0, "dist_sync-x", "push", "e", rank=rank, extra={**rsp, "rows": 4})
        )
        for server in (0, 1):
            model.on_event(
                Event(
                    0,
                    1.0,
                    "dist_sync-x",
                    "push",
                    "e",
                    rank=rank,
                    server=server,
                    extra={**rsp, "rows": 2},
                    first_piece=server == 0,
                )
            )
    record = Event(
        0,
        2.0,
        "dist_sync-x",
        "push",
        None,
        rank=0,
        count=2,
        tally=True,
        extra={"keys": ["e"], "counts": [2], "nbytes": [64], "rows": [10]},
    )
    model.on_event(record)  # a rank's counted pushes: rows only, its servers count them
    model.flush()
    stats = model.keys["e"]
    assert (stats.pushes, stats.rows_in, stats.sparse) == (3, 3 * 4 + 10, True)


def test_a_key_cut_over_two_servers_is_pushed_the_bytes_of_every_piece():
    """Each server's receipt of a push of a key cut over 2 servers holds its own rows
    (and their ids): the key's pushed bytes are the pieces' sum, detailed or counted
    in a record, and the push is counted once (slice 0's receipt)."""
    model = MonitorModel()
    rsp = {"stype": "row_sparse"}
    model.on_event(Event(0, 1.0, "dist_sync-x", "init", "e", shape=(8, 2), extra=dict(rsp)))
    pieces = {0: 3 * (8 + 8), 1: 5 * (8 + 8)}  # server 0 got 3 rows, server 1 five
    for server, nbytes in pieces.items():
        model.on_event(
            Event(
                0, 1.0, "dist_sync-x", "push", "e", rank=0, server=server, nbytes=nbytes,
                extra=dict(rsp), first_piece=server == 0,
            )
        )  # fmt: skip
    model.on_event(Event(0, 1.1, "dist_sync-x", "push", "e", rank=0, extra={**rsp, "rows": 8}))
    for server, nbytes in pieces.items():  # two more pushes each, only counted
        record = {"keys": ["e"], "counts": [2], "nbytes": [2 * nbytes], "first": [server == 0]}
        model.on_event(
            Event(0, 2.0, "dist_sync-x", "push", None, server=server, count=2, tally=True,
                  extra=record)
        )  # fmt: skip
    rank_record = {"keys": ["e"], "counts": [2], "nbytes": [2 * 8 * 16], "rows": [16]}
    model.on_event(
        Event(0, 2.0, "dist_sync-x", "push", None, rank=0, count=2, tally=True, extra=rank_record)
    )  # the rank's view of those pushes: their rows
    model.on_event(
        Event(0, 2.0, "dist_sync-x", "pull", "e", rank=0, count=3, nbytes=3 * 8 * 16,
              extra={**rsp, "rows": 24})
    )  # fmt: skip
    model.flush()
    stats = model.keys["e"]
    assert (stats.pushes, stats.pulls) == (3, 3)
    assert stats.bytes_in == stats.bytes_out == 3 * 8 * 16
    assert _column(model, "e")["rows per push / pull"] == "8 / 8"
