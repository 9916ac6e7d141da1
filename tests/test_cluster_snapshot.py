"""Each part of a server's state as a snapshot and back (``snapshot()`` /
``restore()``), the whole ``ServerSnapshot`` a new replica is seeded with, and
a seeded replica that ends bit-identical to its primary. No Dask: the parts
alone, or in-process replicas."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle

import numpy as np
import pytest

import labkv
from labkv.cluster._errors import Failure
from labkv.cluster._protocol.entries import Vote
from labkv.cluster._protocol.messages import KeyMeta
from labkv.cluster._server.key_table import KeyTable
from labkv.cluster._server.replication.seed import ServerSnapshot, ShardSnapshot
from labkv.cluster._server.rounds import SyncRounds
from labkv.cluster._server.sender_order import SenderOrder, UpdateQueues
from labkv.cluster._server.ssp_clocks import Clocks
from labkv.cluster._server.updates import KeptVotes
from labkv.cluster._server.waiting import Waiters
from labkv.devices import cpu
from labkv.optimizers import SGD
from labkv.shard import Shard
from tests._inprocess import InProcessCluster


def test_a_key_table_comes_back_equal_and_owns_its_copy():
    table = KeyTable(sid=1)
    table.add("w", KeyMeta((4,), "float32", 0), whole=False)
    table.add(3, KeyMeta((2,), "float64", 1), whole=True)
    snap = table.snapshot()
    table.add("late", KeyMeta((1,), "float32", 2), whole=True)  # after the snapshot
    again = KeyTable(sid=1)
    again.restore(pickle.loads(pickle.dumps(snap)))
    assert again.meta == {"w": KeyMeta((4,), "float32", 0), 3: KeyMeta((2,), "float64", 1)}
    assert again.sliced == {"w"} and again.first_piece == {"w": False, 3: True}


def test_rounds_come_back_with_their_owed_failures_and_without_open_rounds():
    class NotebookError(Exception):  # a class no module defines: travels by value
        pass

    rounds = SyncRounds(num_workers=2)
    for key in ("w", "b", "c"):
        rounds.add(key)
    failure = Failure(NotebookError("no"), 0, ["w", "b"], {"r0": {"w": 1, "b": 1}})
    rounds["w"].finish(failure), rounds["b"].finish(failure), rounds["c"].finish()
    rounds.join("c", rank=0, sender="r0", seq=2, value=1.0, now=0.0)  # open: not taken
    again = SyncRounds(num_workers=1)
    again.restore(pickle.loads(pickle.dumps(rounds.snapshot())), server=5)
    assert again.num_workers == 2
    assert {k: again[k].done for k in "wbc"} == {"w": 1, "b": 1, "c": 1}
    assert again["c"].pending == {} and again["w"].failures[0] is again["b"].failures[0]
    restored = again["w"].failures[0]
    assert (restored.server, restored.keys, restored.untold) == (5, ["w", "b"], failure.untold)
    told = again["b"].report_to("r0")
    assert type(told).__name__ == "NotebookError" and again["w"].report_to("r0") is None


def test_clocks_come_back_answering_every_pull_as_before():
    clocks = Clocks(staleness=1, num_workers=3)
    for sender, rank, keys in [("a", 0, ["w", "b"]), ("a", 0, ["w"]), ("c", 2, ["w"])] * 2:
        clocks.pushed(sender, rank, keys)
    again = Clocks(staleness=1, num_workers=1)  # a replica started for one rank
    again.restore(pickle.loads(pickle.dumps(clocks.snapshot())))
    assert again.ranks == {"a": 0, "c": 2}
    for key in ("w", "b", "never"):
        assert again.of(key) == clocks.of(key)
        for rank in range(3):
            assert again.ready(key, rank) == clocks.ready(key, rank)
    clocks.pushed("a", 0, ["w"])  # the snapshot is a copy
    assert again.of("w") != clocks.of("w")


def test_update_queues_come_back_numbering_each_senders_decided_pushes():
    queues = UpdateQueues()
    q = queues.of("w")
    for n in range(3):
        q.arrive("a", value=float(n), seq=n, leader=True)
    q.arrive("b", value=9.0, seq=0, leader=True)
    for position in range(2):  # a's first two updates decided, the rest waiting
        q.take(position)
        q.decided("a")
    again = UpdateQueues()
    again.restore(pickle.loads(pickle.dumps(queues.snapshot())))
    assert again["w"].arrived == {"a": 2, "b": 0}
    assert again["w"].data == {} and again["w"].order == {}


def test_the_senders_order_and_the_kept_votes_come_back_equal():
    order = SenderOrder(Waiters("server 0", 1.0))
    for sender, seq in [("a", 0), ("a", 1), ("b", 0)]:
        order.passed(sender, seq)
    again = SenderOrder(Waiters("server 0", 1.0))
    again.restore(order.snapshot())
    assert (again.next("a"), again.next("b"), again.next("c")) == (2, 1, 0)
    kept = KeptVotes()
    for number in range(3):
        kept.keep(Vote("w", number, ValueError(f"slice {number}") if number else None, None))
    back = KeptVotes()
    back.restore(pickle.loads(pickle.dumps(kept.snapshot())))
    assert [(v.number, repr(v.error)) for v in back] == [
        (1, "ValueError('slice 1')"),
        (2, "ValueError('slice 2')"),
    ]


def _trained_shard(setting):
    shard = Shard()
    for key, n in [("w", 3), ("big", 1 << 12)]:
        shard.init(key, np.zeros(n, np.float32))
    if setting == "optimizer":
        shard.set_optimizer(SGD(learning_rate=0.1, momentum=0.9), provisional=True)
    elif setting == "updater":
        shard.set_updater(lambda key, grad, stored: stored.__iadd__(2 * grad))
    shard.last_setting["r0"] = "token"
    rng = np.random.default_rng(0)
    for _ in range(3):
        shard.apply(
            [(k, [rng.standard_normal(v.size).astype(np.float32)]) for k, v in shard.values.items()]
        )
    return shard


@pytest.mark.parametrize("setting", ["assign", "optimizer", "updater"])
@pytest.mark.parametrize("survivor", [False, True], ids=["new", "survivor"])
def test_a_shard_comes_back_making_the_same_bits_as_the_original(setting, survivor):
    shard = _trained_shard(setting)
    snap = pickle.loads(pickle.dumps(ShardSnapshot.of(shard)))
    again = Shard()
    if survivor:  # a backup re-seeded after a promotion holds the keys already
        again.init("w", np.full(3, 7.0, np.float32))
        again.init("big", np.full(1 << 12, 7.0, np.float32))
        again.init("gone", np.zeros(2, np.float32))  # not on the primary: dropped
    snap.restore(again, cpu(0))
    assert sorted(again.values) == sorted(shard.values)
    assert again.provisional == shard.provisional and again.last_setting == {"r0": "token"}
    assert (again.optimizer is None) == (shard.optimizer is None)
    assert (again.updater is None) == (shard.updater is None)
    grads = [("w", [np.full(3, 0.5, np.float32)]), ("big", [np.ones(1 << 12, np.float32)])]
    shard.apply(grads), again.apply(grads)  # the next update: the same bits on both
    for key in ("w", "big"):
        np.testing.assert_array_equal(again.read(key), shard.read(key))
        assert not np.shares_memory(again.read(key), shard.read(key))
    if setting == "optimizer":
        assert again.export_states()[:2] == shard.export_states()[:2]
        for key, state in shard.states.items():
            for a, b in zip(again.states[key], state, strict=True):
                np.testing.assert_array_equal(a, b)


def _same(a, b, path="snapshot"):
    """``a`` and ``b`` (snapshots) hold the same values, bit for bit."""
    if dataclasses.is_dataclass(a):
        assert type(a) is type(b), path
        for f in dataclasses.fields(a):
            _same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)) and not hasattr(a, "_fields"):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, bytes):  # cloudpickled: compared as what it holds
        assert repr(pickle.loads(a)) == repr(pickle.loads(b)), path
    else:
        assert a == b, path


def _snapshot(c, server):
    async def take():
        return server.seeding.snapshot()

    return asyncio.run_coroutine_threadsafe(take(), c.group.loop).result(timeout=5)


def _steps(c, first, last):
    (kv,) = c.ranks
    for step in range(first, last):
        kv.push(["w", "big"], [np.full(3, step, np.float32), np.full(64, -step, np.float32)])
        kv.pull(["w", "big"])


@pytest.mark.parametrize("kind", ["dist_sync", "dist_async", "dist_ssp"])
def test_a_replica_seeded_from_its_primary_ends_bit_identical(kind):
    kw = {"staleness": 1} if kind == "dist_ssp" else {}
    with InProcessCluster(kind, num_servers=1, num_workers=1, replicas=2, timeout=5.0, **kw) as c:
        (kv,) = c.ranks
        kv.init(["w", "big"], [np.zeros(3, np.float32), np.zeros(64, np.float32)])
        kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.1, momentum=0.9))
        _steps(c, 0, 4)
        primary = c.group.replicas_of[0][0]
        snap = _snapshot(c, primary)
        assert isinstance(snap, ServerSnapshot)
        _same(pickle.loads(pickle.dumps(snap)), snap)  # it pickles, as it travels
        seeded = c.group.reseed(0)
        _same(_snapshot(c, seeded), _snapshot(c, primary))
        _steps(c, 4, 7)  # the entries after the seed reach it too
        kv.flush()
        _same(_snapshot(c, seeded), _snapshot(c, primary))
