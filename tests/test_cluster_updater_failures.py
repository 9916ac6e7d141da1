"""A custom updater that fails on the servers behaves as on the local store: its
own exception, once per rank, nothing half-updated, nothing hangs."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import labkv
from labkv.cluster import ClusterError, run
from tests._waiting import server_tasks

KINDS = ["dist_sync", "dist_async"]


class Refused(ValueError):
    """An updater's own exception class (travels to the ranks by value)."""


def _refuse_above_4(key, merged, stored):
    stored += merged  # changes its argument before it fails
    if float(merged.max()) > 4:
        raise Refused(f"refused {float(merged.max()):g} for {key!r}")


def _add(key, merged, stored):
    stored += merged


def _caught(call):
    """``(exception class name, message with notes)`` of a call that must raise."""
    try:
        call()
    except Exception as exc:
        return type(exc).__name__, " ".join([str(exc), *getattr(exc, "__notes__", [])])
    raise AssertionError("the call did not raise")


@pytest.fixture(params=KINDS)
def kv(request, handle):
    store = labkv.create(request.param, cluster=handle, num_servers=2, bigarray_bound=4)
    yield store
    store.close()


# -- 1. an updater that cannot travel ------------------------------------------------


class _HoldsALock:
    def __init__(self):
        self.lock = threading.Lock()

    def __call__(self, key, merged, stored):
        stored += merged


def test_an_updater_that_cannot_be_pickled_is_refused_at_once_and_changes_nothing(kv):
    kv.init("w", np.zeros(2, np.float32))
    kv.set_updater(_add)
    start = time.monotonic()
    with pytest.raises(TypeError, match=r"cannot be pickled .*cannot pickle '_thread.lock'"):
        kv.set_updater(_HoldsALock())
    assert time.monotonic() - start < 2
    kv.push("w", np.ones(2, np.float32))
    kv.push("w", np.ones(2, np.float32))
    np.testing.assert_array_equal(kv.pull("w"), [2, 2])  # the previous updater still runs


# -- 2 and 5: reported once, as the updater's own exception -------------------------


def _rank_meets_a_failed_update(kv):
    kv.init("w", np.zeros(2, np.float32))
    if kv.rank == 0:
        kv.set_updater(_refuse_above_4)
    kv.barrier()
    seen = []
    kv.push("w", np.full(2, 3.0, np.float32))  # dist_sync: 3 + 3 = 6 is refused
    for _ in range(3):
        try:
            seen.append(kv.pull("w").tolist())
        except Refused as exc:
            seen.append(("Refused", str(exc), " ".join(exc.__notes__)))
    return seen


def test_a_failed_round_reaches_each_rank_once_as_its_own_exception(handle):
    for seen in run(_rank_meets_a_failed_update, num_workers=2, cluster=handle, timeout=20):
        (name, message, notes), *later = seen
        assert name == "Refused" and message == "refused 6 for 'w'"
        assert "on server" in notes and "keys ['w'] in round 0" in notes
        assert later == [[0.0, 0.0], [0.0, 0.0]]  # unchanged, and served from now on


def _rank_fails_then_enters_a_barrier(kv, pushes):
    kv.init("w", np.zeros(2, np.float32))
    if kv.rank == 0:
        kv.set_updater(_refuse_above_4)
    kv.barrier()
    seen = []
    calls = [
        lambda: kv.push("w", np.full(2, pushes[kv.rank], np.float32)),
        kv.barrier,  # where a push not waited for is told of its failure
        *[lambda: kv.pull("w").tolist()] * 3,
    ]
    for call in calls:
        try:
            result = call()
        except Refused as exc:
            result = ("Refused", str(exc), " ".join(exc.__notes__))
        if result is not None:
            seen.append(result)
    return seen


@pytest.mark.parametrize(
    "kind, pushes, told, value",
    [
        # dist_sync: the round of 3 + 3 fails; both ranks' pushes were in it
        ("dist_sync", (3.0, 3.0), {0: "refused 6", 1: "refused 6"}, [0.0, 0.0]),
        # dist_async: each push is applied alone; only rank 0's 9 is refused
        ("dist_async", (9.0, 1.0), {0: "refused 9"}, [1.0, 1.0]),
    ],
)
def test_a_failed_update_reaches_each_rank_whose_push_it_was_once_and_no_barrier_hangs(
    handle, kind, pushes, told, value
):
    ranks = run(
        _rank_fails_then_enters_a_barrier,
        num_workers=2,
        cluster=handle,
        kvstore=kind,
        args=(pushes,),
        timeout=20,
    )
    for rank, seen in enumerate(ranks):
        errors = [s for s in seen if isinstance(s, tuple)]
        if rank in told:
            [(name, message, notes)] = errors  # once, and before any pull that served
            assert seen[0] == errors[0]
            assert name == "Refused" and message == f"{told[rank]} for 'w'"
            assert "on server" in notes and "keys ['w']" in notes and "is lost" not in notes
        else:
            assert errors == []  # never told of another rank's failed push
        served = [s for s in seen if not isinstance(s, tuple)]
        assert len(served) >= 2 and served == [value] * len(served)  # then the value is served


@pytest.mark.parametrize("error", [ValueError, RuntimeError, OSError, KeyError])
def test_the_updaters_own_exception_class_reaches_the_caller_never_a_lost_server(kv, error):
    def fail(key, merged, stored):
        raise error("from the updater")

    kv.init(["w", "big"], [np.zeros(2, np.float32), np.zeros(8, np.float32)])
    kv.set_updater(fail)
    for key, size in (("w", 2), ("big", 8)):
        kv.push(key, np.ones(size, np.float32))
        name, text = _caught(lambda key=key: kv.pull(key))
        assert name == error.__name__, text
        assert "from the updater" in text and "is lost" not in text
        assert f"keys [{key!r}]" in text
        np.testing.assert_array_equal(kv.pull(key), np.zeros(size))


# -- 3. nothing half-updated ----------------------------------------------------------


def test_a_failing_update_leaves_every_slice_of_its_key_unchanged(kv):
    kv.init("s", np.zeros(6, np.float32))
    assert len(kv.placement()["s"]) == 2  # slices [0, 3) and [3, 6) on two servers
    kv.set_updater(_refuse_above_4)
    kv.push("s", np.array([1, 1, 1, 9, 9, 9], np.float32))  # only server 1's slice fails
    assert _caught(lambda: kv.pull("s"))[0] == "Refused"
    np.testing.assert_array_equal(kv.pull("s"), np.zeros(6))
    kv.push("s", np.array([9, 9, 9, 1, 1, 1], np.float32))  # only server 0's slice fails
    assert _caught(lambda: kv.pull("s"))[0] == "Refused"
    np.testing.assert_array_equal(kv.pull("s"), np.zeros(6))
    kv.push("s", np.full(6, 2.0, np.float32))  # a good update still commits everywhere
    np.testing.assert_array_equal(kv.pull("s"), np.full(6, 2.0))


def test_keys_on_another_server_keep_their_update_when_one_key_fails(kv):
    # Documented: a push is atomic per key (all its slices) and per server, not
    # across servers; keys 0 and 1 live on servers 0 and 1.
    kv.init([0, 1], [np.zeros(2, np.float32), np.zeros(2, np.float32)])
    assert [kv.placement()[k][0]["server"] for k in (0, 1)] == [0, 1]
    kv.set_updater(_refuse_above_4)
    kv.push([0, 1], [np.ones(2, np.float32), np.full(2, 9.0, np.float32)])
    assert _caught(lambda: kv.pull([0, 1]))[0] == "Refused"
    np.testing.assert_array_equal(kv.pull(0), [1, 1])
    np.testing.assert_array_equal(kv.pull(1), [0, 0])


def _halve_then_add(key, merged, stored):
    stored *= 0.5  # the order of updates matters: each slice must see the same order
    stored += merged


def _ranks_push_a_sliced_key(kv, steps):
    kv.init("s", np.zeros(8, np.float32))
    if kv.rank == 0:
        kv.set_updater(_halve_then_add)
    kv.barrier()
    for step in range(steps):
        kv.push("s", np.full(8, 10.0 * kv.rank + step, np.float32))
    kv.barrier()
    return kv.pull("s")


def test_async_slices_apply_the_ranks_updates_in_one_order(handle):
    values = run(
        _ranks_push_a_sliced_key,
        num_workers=2,
        num_servers=2,
        kvstore="dist_async",
        bigarray_bound=4,
        cluster=handle,
        args=(30,),
        timeout=20,
    )
    for value in values:
        assert len(set(value.tolist())) == 1, value  # one order on both slices
    np.testing.assert_array_equal(values[0], values[1])


# -- 6. compression residuals ----------------------------------------------------------


def _compressed_steps(kv):
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    kv.init("g", np.zeros(3, np.float32))

    def refuse_big(key, merged, stored):
        stored += merged
        if float(merged.max()) > 0.9:
            raise ValueError("refused")

    kv.set_updater(refuse_big)
    pulled = []
    for grads in ([np.full(3, 0.7, np.float32)] * 2, [np.full(3, 0.3, np.float32)]):
        for call in (lambda grads=grads: kv.push("g", grads), lambda: pulled.append(kv.pull("g"))):
            try:
                call()
            except ValueError:
                pulled.append("refused")
    return pulled


def test_a_failed_compressed_push_leaves_the_residual_as_the_local_store_does(kv):
    local = _compressed_steps(labkv.create("local"))
    dist = _compressed_steps(kv)
    assert local[0] == "refused" and dist[0] == "refused"  # raised at push or at the pull
    assert [str(v) for v in dist[-1:]] == [str(v) for v in local[-1:]]
    np.testing.assert_array_equal(dist[-1], np.zeros(3))  # 0.3 alone sends nothing


# -- 7. smaller ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("timeout", [-1, 0, float("nan"), "10"])
def test_a_bad_timeout_is_refused_clearly(handle, kind, timeout):
    # An earlier test's servers may still be leaving the scheduler: compare which
    # tasks there are, not how many.
    before = set(server_tasks(handle.client))
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        labkv.create(kind, cluster=handle, timeout=timeout)
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        run(_add, cluster=handle, kvstore=kind, timeout=timeout)
    assert set(server_tasks(handle.client)) <= before  # no server was started


@pytest.mark.parametrize("kind", KINDS)
def test_an_address_string_is_refused_with_the_way_to_connect(handle, kind):
    with pytest.raises(TypeError, match=r"connect to it first: labkv.cluster.connect\(.tcp://"):
        labkv.create(kind, cluster=handle.address)
    with pytest.raises(TypeError, match="cluster must be a ClusterHandle"):
        run(_add, cluster=handle.address, kvstore=kind)


@pytest.mark.parametrize("kind", KINDS)
def test_a_closed_store_says_so(handle, kind):
    kv = labkv.create(kind, cluster=handle, num_servers=1)
    kv.init(0, np.zeros(2, np.float32))
    kv.close()
    for call in (lambda: kv.pull(0), lambda: kv.push(0, np.ones(2, np.float32))):
        with pytest.raises(ClusterError, match=r"the store .* is closed"):
            call()


# -- two documented behaviours that follow MXNet, not the local store ---------------


def _decaying_sgd() -> labkv.optimizers.SGD:
    schedule = labkv.lr_scheduler.FactorScheduler(step=1, factor=0.5, base_lr=1.0)
    return labkv.optimizers.SGD(learning_rate=1.0, lr_scheduler=schedule)


def test_each_server_counts_its_own_updates_for_the_lr_scheduler(kv):
    local = labkv.create("local")
    for store in (local, kv):
        store.init([0, 1], [np.zeros(2, np.float32), np.zeros(2, np.float32)])
        store.set_optimizer(_decaying_sgd())
        for _ in range(3):
            store.push(0, np.ones(2, np.float32))
        store.push(1, np.ones(2, np.float32))
    assert [kv.placement()[k][0]["server"] for k in (0, 1)] == [0, 1]
    np.testing.assert_array_equal(kv.pull(0), local.pull(0))  # one server, one count
    # Key 1's first update: the 4th of the local store's single count (a decayed
    # rate), the 1st of server 1's own count (the base rate).
    np.testing.assert_array_equal(kv.pull(1), [-1.0, -1.0])
    assert float(local.pull(1)[0]) > -1.0


def _to_unit_norm(key, merged, stored):
    stored[:] = merged / np.linalg.norm(merged)  # not element-wise


def test_a_custom_updater_on_a_sliced_key_sees_one_flat_slice_per_server(kv):
    local = labkv.create("local")
    for store in (local, kv):
        store.init("s", np.zeros((2, 4), np.float32))
        store.set_updater(_to_unit_norm)
        store.push("s", np.ones((2, 4), np.float32))
    assert len(kv.placement()["s"]) == 2
    assert np.linalg.norm(local.pull("s")) == pytest.approx(1.0)
    assert np.linalg.norm(kv.pull("s")) == pytest.approx(2**0.5)  # each slice scaled alone
