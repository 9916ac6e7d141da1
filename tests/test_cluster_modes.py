"""What a push and a pull do in each mode (``labkv.cluster._server.modes``), and
the log a server issues to (``NullLog`` until it joins a group, then
``ReplicaLog``): real ``Server`` objects driven directly on an event loop, no
Dask, no ranks, in milliseconds."""

from __future__ import annotations

import asyncio

import cloudpickle
import numpy as np
import pytest

from labkv.cluster._errors import ClusterError
from labkv.cluster._protocol.messages import (
    InitItem,
    Pull,
    Push,
    PushHeader,
    decode_values,
    encode,
    values_items,
)
from labkv.cluster._protocol.packing import pack
from labkv.cluster._server.actor import Server
from labkv.cluster._server.modes import AsyncMode, SspMode, SyncMode
from labkv.cluster._server.replication.null import NullLog
from labkv.cluster._server.replication.replica_log import ReplicaLog
from labkv.cluster._transport.base import Host
from tests._inprocess import InProcessCluster

SHAPE = (2,)


async def _server(kind="dist_sync", num_workers=2, timeout=0.3, staleness=None):
    sync = kind == "dist_sync"
    server = Server(0, "t", num_workers, sync, timeout, "t", "cpu", staleness, host=Host())
    await server.link([("in-process", "only")])
    await server.init([InitItem("w", np.zeros(SHAPE, np.float32), SHAPE, "float32", 0)])
    return server


def _push(sender, rank, seq, value, keys=("w",)):
    values = [np.full(SHAPE, value, np.float32) for _ in keys]
    header = PushHeader(sender, rank, seq, list(keys), None, [], False, None)
    return encode(Push(header, pack(values), []))


def _pull(sender, seq):
    return encode(Pull(sender, seq, ["w"], None, None, None, ()))


def _read(reply):
    ((_, value),) = values_items(["w"], decode_values(reply), lambda k: (np.float32, SHAPE))
    return value.tolist()


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize(
    ("kind", "staleness", "mode"),
    [("dist_sync", None, SyncMode), ("dist_async", None, AsyncMode), ("dist_ssp", 1, SspMode)],
)
def test_each_kind_of_store_gets_its_mode_and_issues_to_the_log_of_its_group(kind, staleness, mode):
    async def main():
        server = await _server(kind, staleness=staleness)
        assert type(server.mode) is mode
        assert type(server.log) is NullLog and server.primary
        assert server.mode.log is server.log and server.updates.log is server.log
        await server.join_group([("in-process", "only"), ("in-process", "backup")], 0)
        assert type(server.log) is ReplicaLog and server.primary
        assert server.mode.log is server.log and server.updates.log is server.log
        assert server.seeding is not None and server.seeding.log is server.log

    run(main())


def test_dist_sync_a_pull_waits_for_the_round_its_rank_pushed_in():
    async def main():
        server = await _server("dist_sync")
        await server.push(_push("a", 0, 0, 1.0))
        with pytest.raises(ClusterError, match=r"ranks \[1\] have not pushed key 'w' in round 0"):
            await server.pull(_pull("a", 1))
        assert _read(await server.pull(_pull("notebook", 0))) == [0.0, 0.0]  # never pushed
        await server.push(_push("b", 1, 0, 2.0))
        assert _read(await server.pull(_pull("a", 1))) == [3.0, 3.0]

    run(main())


def test_dist_sync_a_rank_a_round_ahead_waits_for_the_others():
    async def main():
        server = await _server("dist_sync", timeout=5.0)
        await server.push(_push("a", 0, 0, 1.0))
        ahead = asyncio.ensure_future(server.push(_push("a", 0, 1, 10.0)))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not ahead.done() and server.rounds["w"].done == 0
        await server.push(_push("b", 1, 0, 2.0))
        await ahead
        pending = server.rounds["w"].pending
        assert server.rounds["w"].done == 1 and {r: v.tolist() for r, v in pending.items()} == {
            0: [10.0, 10.0]
        }

    run(main())


def test_dist_async_applies_each_push_as_it_arrives():
    async def main():
        server = await _server("dist_async")
        await server.push(_push("a", 0, 0, 1.0))
        assert _read(await server.pull(_pull("a", 1))) == [1.0, 1.0]  # no round to wait for
        await server.push(_push("b", 1, 0, 2.0))
        assert _read(await server.pull(_pull("a", 1))) == [2.0, 2.0]

    run(main())


def test_dist_ssp_a_pull_waits_until_every_rank_is_within_the_bound():
    async def main():
        server = await _server("dist_ssp", staleness=0)
        await server.push(_push("a", 0, 0, 1.0))
        with pytest.raises(ClusterError, match="slowest: rank 1 at clock 0"):
            await server.pull(_pull("a", 1))
        await server.push(_push("b", 1, 0, 2.0))
        assert _read(await server.pull(_pull("a", 1))) == [2.0, 2.0]
        assert server.clocks.of("w") == {0: 1, 1: 1}

    run(main())


def _raises(key, grad, stored):
    raise ValueError("no")


@pytest.mark.parametrize("replicas", [1, 2])
def test_dist_ssp_a_failed_push_still_advances_its_ranks_clock_on_every_replica(replicas):
    with InProcessCluster(
        "dist_ssp", num_servers=1, num_workers=2, replicas=replicas, staleness=0, timeout=5.0
    ) as c:
        r0, r1 = c.ranks
        for kv in c.ranks:
            kv.init("w", np.zeros(2, np.float32))
        r0.set_updater(_raises)
        r0.push("w", np.ones(2, np.float32))
        with pytest.raises(ValueError, match="no"):
            r0.flush()
        servers = c.group.replicas_of[0] if replicas > 1 else c.servers
        for server in servers:  # rank 1's pulls need not wait for a push that failed
            assert server.clocks.of("w") == {0: 1, 1: 0}


def _add(key, grad, stored):
    stored += grad


def test_a_resent_push_is_dropped_by_a_replica_log_only():
    async def twice(replicated):
        server = await _server("dist_async")
        await server.set_updater(cloudpickle.dumps(_add))
        if replicated:
            await server.join_group([("in-process", "only")], 0)  # a group of one
        replies = [await server.push(_push("a", 0, 0, 1.0)) for _ in range(2)]
        (value,) = await server.peek(["w"])
        return replies, value.tolist()

    # without replicas there are no resends: each push is applied, and has no reply
    assert run(twice(False)) == ([None, None], [2.0, 2.0])
    # the second is the resend of a failover: applied once; acked up to push 1, epoch 0
    assert run(twice(True)) == ([(1, 0, None), (1, 0, None)], [1.0, 1.0])


def test_a_dist_sync_push_in_an_open_round_is_neither_applied_twice_nor_acknowledged():
    async def main():
        server = await _server("dist_sync", timeout=5.0)
        await server.join_group([("in-process", "only")], 0)
        first = await server.push(_push("a", 0, 0, 1.0))
        again = await server.push(_push("a", 0, 0, 1.0))  # a resend: not a round ahead
        assert first[0] == again[0] == 0  # rank 0's push 0 waits in the open round
        assert {r: v.tolist() for r, v in server.rounds["w"].pending.items()} == {0: [1.0, 1.0]}
        await server.push(_push("b", 1, 0, 2.0))
        acked, _, reply = await server.pull(_pull("a", 1))
        assert acked == 1 and _read(reply) == [3.0, 3.0]

    run(main())


def test_a_pull_reply_is_the_payload_alone_without_replicas():
    async def main():
        server = await _server("dist_async")
        reply = await server.pull(_pull("a", 0))
        assert _read(reply) == [0.0, 0.0]
        await server.join_group([("in-process", "only")], 0)
        acked, epoch, payload = await server.pull(_pull("a", 0))
        assert (acked, epoch, _read(payload)) == (0, 0, [0.0, 0.0])

    run(main())


def test_only_dist_sync_reports_rounds():
    async def main(kind):
        server = await _server(kind, num_workers=1)
        events = []
        server.bus.subscribe(events.append)
        await server.push(_push("a", 0, 0, 1.0))
        server.bus.flush()  # a key's round goes out once per flush, as it is then
        return [(e.op, e.extra.get("complete")) for e in events if e.op == "round"]

    assert run(main("dist_sync")) == [("round", True)]
    assert run(main("dist_async")) == []


def test_a_new_run_resets_the_clocks_and_lets_waits_succeed_again():
    async def main():
        server = await _server("dist_ssp", staleness=0)
        await server.push(_push("a", 0, 0, 1.0))
        await server.abort("stopped")
        with pytest.raises(ClusterError, match="stopped"):
            await server.pull(_pull("a", 1))
        await server.configure(3)
        assert server.clocks.of("w") == {0: 0, 1: 0, 2: 0} and server.rounds.num_workers == 3
        assert _read(await server.pull(_pull("a", 1))) == [1.0, 1.0]

    run(main())
