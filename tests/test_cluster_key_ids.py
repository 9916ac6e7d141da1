"""str keys numbered in init order, as MXNet numbers them: a model's keys
alternate over the servers, and every rank (and the notebook) places every key
on the same server. In-process servers first (fast), then a real LocalCluster."""

from __future__ import annotations

import time

import numpy as np
import pytest

import labkv
from labkv.cluster import ClusterError, run
from labkv.cluster._rank.dist_store import DistStore
from tests._inprocess import InProcessCluster
from tests._waiting import in_threads

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

MODEL = ["W1", "b1", "W2", "b2", "W3", "b3"]
ALTERNATE = [0, 1, 0, 1, 0, 1]
RULE = "string keys are numbered in init order"


def _values():
    return [np.full((4, 3) if k[0] == "W" else 3, i, np.float32) for i, k in enumerate(MODEL)]


def _servers(kv, keys=MODEL):
    placement = kv.placement()
    return [placement[k][0]["server"] for k in keys]


def _fresh_rank(c, rank=1):
    """A new store of rank ``rank`` (not the owner) on ``c``'s servers."""
    return DistStore(c.ranks[0].spec, [], rank, len(c.ranks), owner=False, links=c.group.links)


# -- in-process servers ------------------------------------------------------------------
def test_a_models_keys_alternate_over_two_servers():
    with InProcessCluster(num_servers=2, num_workers=1) as c:
        (kv,) = c.ranks
        kv.init(MODEL, _values())
        assert _servers(kv) == ALTERNATE
        loads = kv.server_load()
        assert [load["keys"] for load in loads] == [3, 3]
        assert all(load["bytes_held"] > 0 for load in loads)
        assert [c.servers[s].meta[k].key_id for k, s in zip(MODEL, ALTERNATE)] == list(range(6))


def test_ranks_that_init_or_only_learn_the_keys_place_them_alike():
    with InProcessCluster("dist_async", num_servers=2, num_workers=2) as c:
        owner, other = c.ranks
        in_threads(lambda: owner.init(MODEL, _values()), lambda: other.init(MODEL, _values()))
        owner.push(MODEL, [v + 1 for v in _values()])
        owner.flush()
        learner = _fresh_rank(c)
        for key, value in zip(MODEL[::-1], _values()[::-1]):  # learned in another order
            np.testing.assert_array_equal(learner.pull(key), value + 1)
        np.testing.assert_array_equal(learner.peek("W2"), _values()[2] + 1)
        for kv in (owner, other, learner):
            assert _servers(kv) == ALTERNATE
        assert learner.placement() == owner.placement()


def test_a_rank_that_learned_keys_numbers_its_next_key_after_them():
    with InProcessCluster("dist_async", num_servers=2, num_workers=2) as c:
        owner, other = c.ranks
        owner.init(MODEL[:3], _values()[:3])
        other.pull("W2")  # learns W2 (id 2) only
        owner.init("b2", np.zeros(3, np.float32))  # id 3: server 1
        other.init("b2", np.zeros(3, np.float32))  # numbered after W2: the same id
        assert _servers(other, ["W2", "b2"]) == _servers(owner, ["W2", "b2"]) == [0, 1]


def test_a_rank_that_numbers_a_key_otherwise_gets_a_clear_error():
    with InProcessCluster(num_servers=2, num_workers=2, timeout=1.0) as c:
        owner, other = c.ranks
        owner.init(["a", "b", "c"], [np.zeros(2)] * 3)  # c: id 2, server 0
        with pytest.raises(ValueError, match=rf"key 'c' .* id 2 .* numbers it 0 \({RULE}"):
            other.init(["c", "b", "a"], [np.zeros(2)] * 3)  # c: id 0, also server 0
        assert other.keys() == []  # the failed init changed nothing
        other.init(["a", "b", "c"], [np.zeros(2)] * 3)
        assert other.placement() == owner.placement()


def test_keys_waited_for_on_the_wrong_server_end_in_the_clear_error():
    with InProcessCluster(num_servers=2, num_workers=2, timeout=1.0) as c:
        owner, other = c.ranks

        def owner_later():
            time.sleep(0.3)  # the other rank is waiting by now
            owner.init(["W1", "b1"], [np.zeros(2)] * 2)

        start = time.monotonic()
        with pytest.raises(ValueError, match=rf"key 'b1' .* id 1 .* numbers it 0 \({RULE}"):
            in_threads(lambda: other.init(["b1", "W1"], [np.zeros(2)] * 2), owner_later)
        assert time.monotonic() - start < 5.0


def test_a_key_the_owner_never_initialises_times_out_naming_the_rule():
    with (
        InProcessCluster(num_servers=2, num_workers=2, timeout=0.5) as c,
        pytest.raises(ClusterError, match=rf"never initialised .*; {RULE}"),
    ):
        c.ranks[1].init("w", np.zeros(2))


def test_int_keys_keep_their_own_value_as_id():
    with InProcessCluster(num_servers=2, num_workers=2) as c:
        owner, other = c.ranks
        owner.init([3, 4, 6], [np.zeros(2)] * 3)
        other.init([6, 3], [np.zeros(2)] * 2)  # any order: an int key is its own id
        assert _servers(owner, [3, 4, 6]) == [1, 0, 0]
        assert _servers(other, [6, 3]) == [0, 1]


def test_key_ids_survive_failover_and_a_reseeded_replica():
    with InProcessCluster("dist_async", num_servers=2, num_workers=2, replicas=2, timeout=5.0) as c:
        owner, other = c.ranks
        owner.init(MODEL, _values())
        owner.push(MODEL, [v * 2 for v in _values()])
        c.group.kill(1)
        outs = [np.empty_like(v) for v in _values()]
        owner.pull(MODEL, out=outs)  # fails over to server 1's backup
        c.group.reseed(1)  # seeded from the new primary
        for s in (0, 1):
            for server in c.group.servers_by_name(s):
                assert {k: m.key_id for k, m in server.meta.items()} == {
                    k: i for i, k in enumerate(MODEL) if ALTERNATE[i] == s
                }
        for key, value in zip(MODEL, _values()):  # learns every key after the failover
            np.testing.assert_array_equal(other.pull(key), value * 2)
        assert _servers(other) == _servers(owner) == ALTERNATE
        c.group.kill(1)  # the re-seeded replica takes over
        owner.init("W4", np.zeros(3, np.float32))  # id 6: server 0
        other.init("W4", np.zeros(3, np.float32))
        np.testing.assert_array_equal(other.pull("b3"), _values()[5] * 2)
        assert other.placement()["W4"][0]["server"] == 0
        assert c.group.servers_by_name(1)[0].meta["b3"].key_id == 5
        assert [len(p[0]["replicas"]) for p in other.placement().values()] == [2, 1] * 3 + [2]


def test_every_piece_names_its_replicas_with_one_replica():
    with InProcessCluster(num_servers=2, num_workers=1, bigarray_bound=4) as c:
        (kv,) = c.ranks
        kv.init(["w", "big"], [np.zeros(2), np.zeros(8)])
        placement = kv.placement()
        assert placement["w"][0]["replicas"] == ["in-process"]
        assert [p["replicas"] for p in placement["big"]] == [["in-process"]] * 2


# -- a real LocalCluster -------------------------------------------------------------------
def test_a_models_keys_alternate_on_a_dask_store(handle):
    with labkv.create("dist_sync", cluster=handle, num_servers=2) as kv:
        kv.init(MODEL, _values())
        assert _servers(kv) == ALTERNATE
        assert all(load["bytes_held"] > 0 for load in kv.server_load())
        addresses = kv.spec.server_addresses
        for key, s in zip(MODEL, ALTERNATE):
            assert kv.placement()[key][0]["replicas"] == [addresses[s]]
            assert kv.placement()[key][0]["device"].endswith("@" + addresses[s])


def _init_model(kv):
    kv.init(MODEL, _values())
    kv.push(MODEL, _values())
    kv.pull(MODEL, out=[np.empty_like(v) for v in _values()])
    return kv.placement()


def test_both_ranks_of_a_run_place_the_model_alike(handle):
    placements = run(_init_model, num_workers=2, cluster=handle, num_servers=2)
    assert placements[0] == placements[1]
    assert [placements[0][k][0]["server"] for k in MODEL] == ALTERNATE


def _init_or_learn(kv):
    if kv.rank == 0:
        kv.init(MODEL, _values())  # waits for the notebook's init
    else:
        for key in MODEL[::-1]:
            kv.pull(key)  # learns each key from the servers
    return kv.placement()


def test_the_notebook_a_rank_that_inits_and_one_that_learns_agree(handle):
    with labkv.create("dist_sync", cluster=handle, num_servers=2) as kv:
        kv.init(MODEL, _values())
        initialised, learned = run(_init_or_learn, num_workers=2, kvstore=kv)
        assert initialised == learned == kv.placement()
        assert _servers(kv) == ALTERNATE


def _init_in_rank_order(kv):
    order = ["W1", "b1"] if kv.rank == 0 else ["b1", "W1"]
    kv.init(order, [np.zeros(2)] * 2)
    return kv.placement()


def test_ranks_initialising_in_other_orders_fail_fast_and_clearly(handle):
    start = time.monotonic()
    # Either key is named: rank 1 may see rank 0's init of one key before the other's.
    swapped = r"key 'b1' .* id 1 .* numbers it 0 |key 'W1' .* id 0 .* numbers it 1 "
    with pytest.raises(ValueError, match=rf"({swapped})\({RULE}"):
        run(_init_in_rank_order, num_workers=2, cluster=handle, num_servers=2, timeout=3)
    assert time.monotonic() - start < 60
