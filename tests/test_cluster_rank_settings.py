"""What every rank's set_optimizer / set_updater / set_gradient_compression /
init means on a cluster: once the call returns on any rank, that rank's later
pushes are applied with it, whenever the store's owner (rank 0) makes the same
call. Real Dask runs check the numbers against a local store; in-process
replicas check that backups and a re-seeded replica keep the same settings."""

from __future__ import annotations

import time

import numpy as np
import pytest

import labkv
from labkv.cluster import run
from tests._inprocess import InProcessCluster
from tests._waiting import in_threads

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

#: How late rank 0 (the owner) makes its call.
DELAY_S = 1.0
KINDS = [
    pytest.param("dist_sync", {}, id="dist_sync"),
    pytest.param("dist_async", {}, id="dist_async"),
    pytest.param("dist_ssp", {"staleness": 1}, id="dist_ssp"),
    pytest.param("dist_sync", {"replicas": 2}, id="dist_sync-replicas2"),
    pytest.param("dist_async", {"replicas": 2}, id="dist_async-replicas2"),
]
COMPRESSION = {"type": "2bit", "threshold": 0.5}


def _grad(rank: int) -> np.ndarray:
    return np.array([[0.7, -1.2, 2.0, 0.25], [1.0, 0.6, -0.7, 1.0]][rank], np.float32)


def _zeros() -> np.ndarray:
    return np.zeros(4, np.float32)


# -- settings, made the same way on the cluster's ranks and the local store ------------
def _sgd(kv):
    kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.1))


def _momentum(kv):
    kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.1, momentum=0.9))


def _double(key, merged, stored):
    stored += 2 * merged


def _doubling(kv):
    kv.set_updater(_double)


def _compressed(kv):
    kv.set_gradient_compression(COMPRESSION)


# -- the ranks -----------------------------------------------------------------------
def _wait_until_pushed(kv, timeout=30.0):
    """Rank 0 of a store that applies pushes as they come: wait until rank 1's
    first push is on the servers (a fixed order of the two ranks' pushes)."""
    if kv.type == "dist_sync":
        return  # one round holds both pushes: their order does not matter
    deadline = time.monotonic() + timeout
    while not kv.peek(0).any():
        assert time.monotonic() < deadline, "rank 1's push never reached the servers"
        time.sleep(0.01)


def _delayed_owner(kv, setting):
    """Rank 1 makes ``setting(kv)``, pushes and pulls at once; rank 0 makes it
    ``DELAY_S`` late (after rank 1's push is applied), then pushes. Both pulls
    of each rank: right after its push, and after the barrier."""
    kv.init(0, _zeros())
    if kv.rank == 0:
        time.sleep(DELAY_S)
        _wait_until_pushed(kv)
    setting(kv)
    kv.push(0, _grad(kv.rank))
    first = kv.pull(0)
    kv.barrier()
    return first, kv.pull(0)


def _reference(kind, setting, per_rank=False):
    """What a local store gives for ``_delayed_owner``'s pushes: rank 1's first
    (dist_sync: one round of both), with ``setting`` made once (``per_rank``:
    again before rank 0's push, as a setting each rank holds for itself).
    ``(value after rank 1's push, value after both)``."""
    kv = labkv.create("local")
    kv.init(0, _zeros())
    setting(kv)
    if kind == "dist_sync":
        kv.push(0, [_grad(0), _grad(1)])
        return kv.pull(0), kv.pull(0)
    kv.push(0, _grad(1))
    after_rank1 = kv.pull(0)
    if per_rank:
        setting(kv)
    kv.push(0, _grad(0))
    return after_rank1, kv.pull(0)


def _check_delayed_owner(handle, kind, kw, setting, per_rank=False):
    results = run(
        _delayed_owner,
        num_workers=2,
        kvstore=kind,
        cluster=handle,
        args=(setting,),
        timeout=30,
        **kw,
    )
    after_rank1, after_both = _reference(kind, setting, per_rank)
    (_, last0), (first1, last1) = results
    np.testing.assert_array_equal(first1, after_rank1)  # rank 1's push used its setting
    np.testing.assert_array_equal(last0, after_both)
    np.testing.assert_array_equal(last1, after_both)


@pytest.mark.parametrize(("kind", "kw"), KINDS)
def test_a_non_owners_optimizer_applies_to_its_pushes_before_the_owner_sets_it(handle, kind, kw):
    _check_delayed_owner(handle, kind, kw, _sgd)


@pytest.mark.parametrize(("kind", "kw"), KINDS)
def test_the_owners_equal_optimizer_keeps_the_momentum_states(handle, kind, kw):
    # were the states reset by rank 0's call, rank 0's step would lack rank 1's momentum
    _check_delayed_owner(handle, kind, kw, _momentum)


@pytest.mark.parametrize(("kind", "kw"), KINDS)
def test_a_non_owners_updater_applies_to_its_pushes_before_the_owner_sets_it(handle, kind, kw):
    _check_delayed_owner(handle, kind, kw, _doubling)


@pytest.mark.parametrize(("kind", "kw"), KINDS[:3])
def test_each_ranks_gradient_compression_applies_to_its_own_pushes(handle, kind, kw):
    _check_delayed_owner(handle, kind, kw, _compressed, per_rank=True)


def _other_optimizer(kv):
    """Rank 0 sets SGD(0.1); rank 1, after it, SGD(0.2): refused. Rank 1 pushes."""
    kv.init(0, _zeros())
    if kv.rank == 0:
        _sgd(kv)
    kv.barrier()
    error = None
    if kv.rank == 1:
        try:
            kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.2))
        except ValueError as exc:
            error = str(exc)
        kv.push(0, _grad(1))
        kv.pull(0)
    kv.barrier()
    return error, kv.pull(0)


@pytest.mark.parametrize("kw", [{}, {"replicas": 2}], ids=["replicas1", "replicas2"])
def test_a_rank_with_another_optimizer_is_refused_and_the_servers_keep_theirs(handle, kw):
    (none, last0), (error, last1) = run(
        _other_optimizer, num_workers=2, kvstore="dist_async", cluster=handle, timeout=30, **kw
    )
    assert none is None
    assert error is not None
    assert "rank 1's optimizer sgd {'learning_rate': 0.2} differs from the one the servers" in error
    assert "sgd {'learning_rate': 0.1}: set the same optimizer on every rank" in error
    local = labkv.create("local")
    local.init(0, _zeros())
    _sgd(local)
    local.push(0, _grad(1))
    np.testing.assert_array_equal(last0, local.pull(0))
    np.testing.assert_array_equal(last1, local.pull(0))


# -- init ------------------------------------------------------------------------------
def _add(key, merged, stored):
    stored += merged


def _late_owner_init(kv):
    """Rank 0 inits ``DELAY_S`` late with 3s; rank 1 at once with zeros. Both set
    an adding updater and push; rank 1 also says when its init returned and what
    it pulled then."""
    before = time.time()
    if kv.rank == 0:
        time.sleep(DELAY_S)
        before = time.time()
        kv.init(0, np.full(4, 3.0, np.float32))
    else:
        kv.init(0, _zeros())  # the owner's value is the one used
    returned = time.time()
    first = kv.pull(0)
    kv.barrier()  # dist_async and dist_ssp: no push before every rank read its init
    kv.set_updater(_add)
    kv.push(0, _grad(kv.rank))
    kv.barrier()
    return before, returned, first, kv.pull(0)


@pytest.mark.parametrize(("kind", "kw"), KINDS[:3])
def test_a_non_owners_init_returns_after_the_owners_with_the_owners_value(handle, kind, kw):
    (owner_began, _, _, last0), (_, returned, first, last1) = run(
        _late_owner_init, num_workers=2, kvstore=kind, cluster=handle, timeout=30, **kw
    )
    assert returned >= owner_began
    np.testing.assert_array_equal(first, np.full(4, 3.0, np.float32))
    # dist_sync sums a round's pushes, then updates once; dist_async and dist_ssp apply
    # each push as it arrives, in either order (float32 sums of another order differ).
    orders = [[(0, 1)]] if kind == "dist_sync" else [[(0,), (1,)], [(1,), (0,)]]
    expected = []
    for order in orders:
        local = labkv.create("local")
        local.init(0, np.full(4, 3.0, np.float32))
        local.set_updater(_add)
        for ranks in order:
            local.push(0, [_grad(r) for r in ranks])
        expected.append(local.pull(0))
    assert any(np.array_equal(last0, e) for e in expected), (last0, expected)
    np.testing.assert_array_equal(last1, last0)


@pytest.mark.parametrize("kind", ["local", "device"])
def test_init_on_a_local_store_is_immediate(kind):
    kv = labkv.create(kind)
    assert (kv.rank, kv.num_workers) == (0, 1)
    kv.init(0, np.full(4, 3.0, np.float32))
    np.testing.assert_array_equal(kv.pull(0), np.full(4, 3.0, np.float32))
    _sgd(kv)
    kv.push(0, _grad(0))
    expected = np.full(4, 3.0, np.float32) - np.float32(0.1) * _grad(0)
    np.testing.assert_allclose(kv.pull(0), expected, rtol=1e-6)


# -- the rules on one server, and on replicas (in process) ----------------------------
def _momentum_reference(grads):
    local = labkv.create("local")
    local.init("w", np.zeros(3, np.float32))
    _momentum(local)
    for g in grads:
        local.push("w", g)
    return local


def test_the_owners_second_optimizer_resets_the_states_as_in_mxnet():
    g = np.ones(3, np.float32)
    with InProcessCluster("dist_async", num_servers=1, num_workers=2) as c:
        owner, other = c.ranks
        for kv in c.ranks:
            kv.init("w", np.zeros(3, np.float32))
        _momentum(other)
        other.push("w", g)
        other.pull("w")
        _momentum(owner)  # equal to the non-owner's: kept, with its states
        _momentum(owner)  # the owner's again: fresh states
        owner.push("w", g)
        got = owner.pull("w")
    fresh = _momentum_reference([g])
    _momentum(fresh)
    fresh.push("w", g)
    np.testing.assert_array_equal(got, fresh.pull("w"))
    assert not np.array_equal(got, _momentum_reference([g, g]).pull("w"))


def test_a_non_owners_updater_is_ignored_where_one_is_set():
    with InProcessCluster("dist_async", num_servers=1, num_workers=2) as c:
        owner, other = c.ranks
        for kv in c.ranks:
            kv.init("w", np.zeros(3, np.float32))
        owner.set_updater(_add)
        other.set_updater(_double)  # the servers keep the owner's
        other.push("w", np.ones(3, np.float32))  # carried by the pull
        np.testing.assert_array_equal(other.pull("w"), np.ones(3, np.float32))
        with pytest.raises(ValueError, match="rank 1's optimizer sgd .* a custom updater"):
            _momentum(other)  # an optimizer is no custom updater: refused


def _shard_state(server):
    shard = server.shard
    config = None if shard.optimizer is None else shard.optimizer.to_config()
    return config, shard.provisional, {k: [s.tolist() for s in v] for k, v in shard.states.items()}


def test_backups_and_a_reseeded_replica_keep_a_non_owners_optimizer_and_its_states():
    grads = [np.full(3, step + 1.0, np.float32) for step in range(4)]
    with InProcessCluster("dist_async", num_servers=1, num_workers=2, replicas=2) as c:
        owner, other = c.ranks
        in_threads(*[lambda kv=kv: kv.init("w", np.zeros(3, np.float32)) for kv in c.ranks])
        _momentum(other)
        other.push("w", grads[0])
        other.pull("w")
        states = [_shard_state(sv) for sv in c.group.servers_by_name(0)]
        assert states[0] == states[1] and states[0][1] is True
        c.group.kill(0)  # the backup takes over
        other.push("w", grads[1])
        other.pull("w")
        c.group.reseed(0)  # a new replica, seeded from the backup
        for kv in c.ranks:  # each rank learns of the new replica
            kv.pull("w")
        c.group.kill(0)  # the re-seeded replica is the primary now
        other.push("w", grads[2])
        other.pull("w")
        _momentum(owner)  # equal: the states of the three pushes survive
        owner.push("w", grads[3])
        np.testing.assert_array_equal(owner.pull("w"), _momentum_reference(grads).pull("w"))
        assert c.group.replicas_of[0][2].primary
        assert _shard_state(c.group.replicas_of[0][2])[1] is False
