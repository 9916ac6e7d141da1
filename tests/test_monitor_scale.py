"""The monitor's event stream at scale: a watched server's rounds as one record per
flush, its receipts counted whatever the detail, and the model's counts exact."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from labkv.cluster._protocol.messages import InitItem
from labkv.cluster._server.actor import Server
from labkv.cluster._transport.base import Host
from labkv.events import COMPACT_AT, compact_rows, round_rows
from labkv.widgets import MonitorModel
from labkv.widgets._fanin import fanin_note
from tests.test_cluster_modes import SHAPE, _push

WORKERS, KEYS, LATE = 64, 50, 17


async def _watched_server(events):
    server = Server(0, "dist_sync-s", WORKERS, True, 5.0, "t", "cpu", None, host=Host())
    await server.link([("in-process", "only")])
    zeros = np.zeros(SHAPE, np.float32)
    await server.init([InitItem(k, zeros, SHAPE, "float32", 0) for k in range(KEYS)])
    server.bus.op_budget = 1  # as a stream subscribes (labkv/cluster/_event_relay.py)
    server.bus.subscribe(events.append, detail_interval=60.0, detail_burst=4)
    return server


async def _push_all(server, ranks):
    keys = tuple(range(KEYS))
    await asyncio.gather(*(server.push(_push(f"r{r}", r, 0, 1.0, keys)) for r in ranks))


def test_a_round_is_one_record_per_flush_and_every_receipt_is_counted():
    events, model = [], MonitorModel()

    async def main():
        server = await _watched_server(events)
        pushes = asyncio.ensure_future(_push_all(server, [r for r in range(WORKERS) if r != LATE]))
        await asyncio.sleep(0.2)  # every rank but LATE has pushed every key
        server.bus.flush()
        before = list(events)
        await asyncio.gather(pushes, _push_all(server, [LATE]))
        server.bus.flush()
        return before

    before = asyncio.run(main())
    rounds = [e for e in before if e.op == "round"]
    assert len(rounds) == 1 and rounds[0].key is None  # one record for the 50 keys
    rows = round_rows(rounds[0])
    assert [k for k, _ in rows] == list(range(KEYS)) and KEYS > COMPACT_AT
    assert all(x["missing"] == [LATE] and len(x["pushed"]) == WORKERS - 1 for _, x in rows)
    receipts = [e for e in before if e.op == "push"]
    detailed = [e for e in receipts if not e.tally]
    assert len(detailed) <= 4  # the op's budget, whatever the 3,150 receipts
    assert sum(e.count for e in receipts) == (WORKERS - 1) * KEYS
    assert sum(c for e in receipts for _, c, _, _ in compact_rows(e)) == (WORKERS - 1) * KEYS
    for e in before:
        model.on_event(e)
    model.flush()
    assert fanin_note(model, now=before[-1].time).endswith(f"rank {LATE} missing on {KEYS} keys")
    assert {s.pushes for s in model.keys.values()} == {WORKERS - 1}
    for e in events[len(before) :]:
        model.on_event(e)
    model.flush()
    assert {s.pushes for s in model.keys.values()} == {WORKERS}  # exact: each push once
    assert fanin_note(model, now=events[-1].time) == f"every round complete ({KEYS} keys)"
    (last,) = [e for e in events[len(before) :] if e.op == "round"]
    assert all(x["complete"] and x["round"] == 0 for _, x in round_rows(last))


def test_dist_ssp_waits_are_one_record_per_key_and_flush_with_exact_pulls():
    from labkv.cluster._server.key_table import KeyTable
    from labkv.cluster._server.reports import Reports
    from labkv.cluster._server.rounds import SyncRounds
    from labkv.cluster._server.ssp_clocks import Clocks
    from labkv.events import EventBus
    from labkv.shard import Shard

    ranks, keys, pulls = 16, 20, 3
    bus = EventBus("dist_ssp-s")
    reports = Reports(0, "cpu(0)", bus, Shard(bus, server=0), KeyTable(0), SyncRounds(ranks))
    clocks = Clocks(staleness=2, num_workers=ranks)
    events = []
    bus.op_budget = 1  # as a stream subscribes
    bus.subscribe(events.append, detail_interval=60.0, detail_burst=4)
    for rank in range(ranks):
        clocks.tick(rank, list(range(keys)) * (rank % 3))  # rank 0 (and 3, 6 ...) slowest
    for _ in range(pulls):
        for rank in range(ranks):
            for key in range(keys):
                reports.clocks(clocks, key, rank, waited=0.001 * rank)
    bus.flush()
    detailed = [e for e in events if "waits" not in e.extra]
    records = [e for e in events if "waits" in e.extra]
    assert len(detailed) == 4 and len(records) == keys  # the budget, then one per key
    model = MonitorModel()
    for e in events:
        model.on_event(e)
    model.flush()
    assert model.counts["clock"] == ranks * keys * pulls
    for key in range(keys):
        c = model.clocks[key]
        assert c.pulls == dict.fromkeys(range(ranks), pulls)
        assert c.waited == pytest.approx({r: pulls * 0.001 * r for r in range(ranks)})
        assert c.last_wait == pytest.approx({r: 0.001 * r for r in range(ranks)})
        assert c.clocks == [r % 3 for r in range(ranks)] and 0 in c.slowest()


def test_a_dist_ssp_record_sent_after_the_run_ended_keeps_the_run_s_ranks():
    """The waits kept for the flush are reported with the clocks of the run they
    were made in, though the store went back to 1 rank before the flush (the
    notebook's store after ``run``: ``Clocks.reset``)."""
    from labkv.cluster._server.key_table import KeyTable
    from labkv.cluster._server.reports import Reports
    from labkv.cluster._server.rounds import SyncRounds
    from labkv.cluster._server.ssp_clocks import Clocks
    from labkv.events import EventBus
    from labkv.shard import Shard

    bus = EventBus("dist_ssp-s")
    reports = Reports(0, "cpu(0)", bus, Shard(bus, server=0), KeyTable(0), SyncRounds(2))
    clocks = Clocks(staleness=1, num_workers=2)
    events = []
    bus.op_budget = 1
    bus.subscribe(events.append, detail_interval=60.0, detail_burst=1)
    clocks.tick(0, ["w", "w", "w"])
    clocks.tick(1, ["w"])
    reports.clocks(clocks, "w", 0, waited=0.1)  # detailed: the budget
    reports.clocks(clocks, "w", 0, waited=0.2)  # kept for the flush
    clocks.reset(1)  # the run ends before the flush
    bus.flush()
    (record,) = [e for e in events if "waits" in e.extra]
    assert record.extra["clocks"] == [3, 1] and record.extra["slowest"] == [1]


@pytest.mark.parametrize("keys", [2, COMPACT_AT + 2])
def test_dist_sync_rounds_sent_after_the_run_ended_keep_the_run_s_ranks(keys):
    """Rounds completed by a run of 2 ranks and reported at a flush after the run
    ended (the notebook's store back to 1 rank: ``SyncRounds.resize``) are reported
    with the run's 2 ranks, one key at a time and as one record: the fan-in showed
    one rank's column after a notebook's Run All."""
    from labkv.cluster._server.key_table import KeyTable
    from labkv.cluster._server.reports import Reports
    from labkv.cluster._server.rounds import SyncRounds
    from labkv.events import EventBus
    from labkv.shard import Shard

    bus = EventBus("dist_sync-s")
    rounds = SyncRounds(2)
    reports = Reports(0, "cpu(0)", bus, Shard(bus, server=0), KeyTable(0), rounds)
    events, model = [], MonitorModel()
    bus.subscribe(events.append, detail_interval=60.0, detail_burst=1)
    for key in range(keys):
        rounds.add(key)
        for rank in (0, 1):
            rounds.join(key, rank, f"r{rank}", 0, 1.0, now=0.0)
        reports.round_ended(key, rounds[key])
        rounds[key].finish()
    rounds.resize(1)  # the run ends before the flush
    bus.flush()
    for e in events:
        model.on_event(e)
    model.flush()
    reported = [x for e in events if e.op == "round" for _, x in round_rows(e)]
    assert len(reported) == keys
    assert all(x["num_workers"] == 2 and x["pushed"] == [0, 1] for x in reported)
    assert all(f.current()["pushed"] == {0, 1} for f in model.fanin.values())
    assert fanin_note(model, now=events[-1].time) == f"every round complete ({keys} keys)"
