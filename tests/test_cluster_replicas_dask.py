"""Replicated servers on a real LocalCluster (3 worker processes): a worker
holding a primary is SIGKILLed in the middle of a training loop driven from
this process, and the loop ends with the numbers of an undisturbed run."""

from __future__ import annotations

import os
import random
import signal
import time

import numpy as np
import pytest

import labkv
from labkv.cluster import ClusterError
from tests._same_run import assert_same_run
from tests._waiting import wait_until

pytestmark = pytest.mark.slow  # real LocalClusters whose workers are killed

STEPS = 30
KEYS = ["w", "b"]


@pytest.fixture(scope="module")
def handle3():
    pytest.importorskip("distributed")
    from labkv.cluster import connect

    handle = connect(n_workers=3, dashboard_address=None, memory_limit="1GiB", set_as_default=False)
    yield handle
    handle.close()


def _pid():
    return os.getpid()


def _kill(handle, address):
    pid = handle.client.run(_pid, workers=[address])[address]
    os.kill(pid, signal.SIGKILL)


def _grad(step, key):
    rng = np.random.default_rng(100 * step + KEYS.index(key))
    return rng.standard_normal({"w": 6, "b": 3}[key]).astype(np.float32)


def _train(handle, kind, kill_at=None, kills=1):
    """30 steps of SGD with momentum; the worker of server 0's primary is
    killed before step ``kill_at`` (and again 8 steps later with ``kills=2``).
    Final values, optimizer states, the store."""
    handle.client.wait_for_workers(3, timeout=60)
    kv = labkv.create(kind, cluster=handle, num_servers=2, replicas=2, timeout=30)
    kv.init(KEYS, [np.zeros(6, np.float32), np.zeros(3, np.float32)])
    kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.05, momentum=0.9, wd=0.01))
    events = []
    kv.events.subscribe(events.append)
    kill_steps = [] if kill_at is None else [kill_at + 8 * i for i in range(kills)]
    outs = [np.empty(6, np.float32), np.empty(3, np.float32)]
    for step in range(STEPS):
        if step in kill_steps:
            primary = kv.placement()["w"][0]["replicas"][0]
            _kill(handle, primary)
        kv.push(KEYS, [_grad(step, k) for k in KEYS])
        kv.pull(KEYS, out=outs)
    states = kv._optimizer_states()
    return [o.copy() for o in outs], states, kv, events


@pytest.mark.parametrize("kind", ["dist_sync", "dist_async"])
def test_a_killed_primary_changes_no_number_of_a_training_run(handle3, kind):
    values, states, kv, _ = _train(handle3, kind)
    kv.close()
    start = time.monotonic()
    after, states_after, kv, events = _train(handle3, kind, kill_at=random.randint(3, 20))
    try:
        assert_same_run(after, states_after, values, states)
        ops = [e.op for e in events]
        assert "failover" in ops and "reseed" in ops
        assert time.monotonic() - start < 60
    finally:
        kv.close()


def test_two_losses_in_a_row_are_survived_with_a_reseed_between(handle3):
    values, states, kv, _ = _train(handle3, "dist_sync")
    kv.close()
    after, _, kv, events = _train(handle3, "dist_sync", kill_at=4, kills=2)
    try:
        for a, b in zip(after, values, strict=True):
            np.testing.assert_array_equal(a, b)
        sid = kv.placement()["w"][0]["server"]
        promoted = [e for e in events if e.op == "failover" and e.extra["promoted"]]
        assert len([e for e in promoted if e.server == sid]) == 2
    finally:
        kv.close()


def test_losing_every_replica_gives_the_lost_error_within_seconds(handle3):
    handle3.client.wait_for_workers(3, timeout=60)
    kv = labkv.create("dist_sync", cluster=handle3, num_servers=1, replicas=2, timeout=30)
    try:
        kv.init(0, np.zeros(2))
        # No free worker to re-seed on: only the two replicas' workers are left alive.
        replicas = kv.placement()[0][0]["replicas"]
        for address in replicas:
            _kill(handle3, address)
        start = time.monotonic()
        with pytest.raises(ClusterError, match=r"server 0 is lost"):
            for _ in range(100):
                kv.push(0, np.ones(2))
                kv.pull(0)
        # the loss, not the store's 30 s timeout (how soon: bench/detect.py)
        assert time.monotonic() - start < 30
    finally:
        kv.close()


def test_more_replicas_than_workers_is_refused(handle3):
    with pytest.raises(ClusterError, match="replicas=4 needs 4 Dask workers"):
        labkv.create("dist_sync", cluster=handle3, num_servers=1, replicas=4)
    with pytest.raises(ValueError, match="replicas must be a positive int"):
        labkv.create("dist_sync", cluster=handle3, replicas=0)


def _decaying(key, grad, stored):
    stored *= 0.9
    stored -= 0.1 * grad


def test_a_custom_updater_on_a_sliced_async_key_keeps_every_replica_equal(handle3):
    """dist_async, a key sliced across 2 servers, each with a backup: the
    servers vote (each vote reaching its backup first, on the channel) and
    every replica of each slice ends with the numbers applied in order here."""
    from labkv.cluster._event_relay import topic_of

    handle3.client.wait_for_workers(3, timeout=60)  # after the kills of the tests before
    kv = labkv.create("dist_async", cluster=handle3, num_servers=2, replicas=2, bigarray_bound=8)
    try:
        kv.init("big", np.zeros(16, np.float32))
        kv.set_updater(_decaying)
        expected = np.zeros(16, np.float32)
        for step in range(6):
            grad = np.arange(16, dtype=np.float32) * (step + 1)
            kv.push("big", grad)
            _decaying("big", grad, expected)
        np.testing.assert_array_equal(kv.pull("big"), expected)
        pieces = kv.placement()["big"]
        assert len(pieces) == 2
        for piece in pieces:
            slices = []
            for address in piece["replicas"]:
                held = handle3.client.run(
                    _slices_held, topic_of(kv._id), piece["server"], workers=[address]
                )[address]
                slices.append(held)
            expect = expected[piece["start"] : piece["stop"]]
            for held in slices:
                np.testing.assert_array_equal(held, expect)
    finally:
        kv.close()


def _slices_held(topic, sid, dask_worker=None):
    (server,) = [
        a
        for a in dask_worker.state.actors.values()
        if getattr(a, "topic", None) == topic and a.sid == sid
    ]
    return np.array(server.shard.read("big"))


def _setup(kv):
    """Keys 0-2 (one on each of the 3 servers), SGD with momentum."""
    kv.init([0, 1, 2], [np.zeros(4, np.float32) for _ in range(3)])
    kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.05, momentum=0.9))


def _ranks_train(kv, steps, pause, shared=False):
    keys = [0, 1, 2]
    if not shared and kv.rank == 0:  # a shared store was set up by its owner
        _setup(kv)
    kv.barrier()
    outs = [np.empty(4, np.float32) for _ in keys]
    for step in range(steps):
        grads = [np.full(4, (step + 1) * (kv.rank + 1) * (k + 1), np.float32) / 7 for k in keys]
        kv.push(keys, grads)
        kv.pull(keys, out=outs)
        time.sleep(pause)
    return outs


def test_ranks_of_a_run_survive_losing_a_worker_that_hosts_only_servers(handle3):
    import threading

    from labkv.cluster import run

    handle3.client.wait_for_workers(3, timeout=60)
    kw = dict(num_workers=2, cluster=handle3, num_servers=3, replicas=2, timeout=30)
    undisturbed = run(_ranks_train, args=(30, 0.0), **kw)
    handle3.client.wait_for_workers(3, timeout=60)
    servers_only = handle3.workers()[2]  # ranks run on the first two workers
    killer = threading.Timer(0.8, _kill, args=(handle3, servers_only))
    killer.start()
    try:
        after = run(_ranks_train, args=(30, 0.05), **kw)
    finally:
        killer.join()
    assert servers_only not in handle3.workers()
    for rank_after, rank_before in zip(after, undisturbed, strict=True):
        for a, b in zip(rank_after, rank_before, strict=True):
            np.testing.assert_array_equal(a, b)


def _shared_run(handle, kill=False):
    """Ranks of ``run(kvstore=kv)`` train on a replicated store made here (the
    worker that hosts only servers killed mid-run with ``kill``); the ranks'
    values, then what this process pulls from the same store afterwards."""
    import threading

    from labkv.cluster import run

    handle.client.wait_for_workers(3, timeout=60)
    kv = labkv.create("dist_sync", cluster=handle, num_servers=3, replicas=2, timeout=30)
    killer = None
    try:
        _setup(kv)
        if kill:
            servers_only = handle.workers()[2]  # ranks run on the first two workers
            killer = threading.Timer(0.8, _kill, args=(handle, servers_only))
            killer.start()
        ranks = run(_ranks_train, num_workers=2, kvstore=kv, args=(30, 0.05 if kill else 0.0, True))
        if killer is not None:
            killer.join()
            assert servers_only not in handle.workers()
        return ranks, kv.pull([0, 1, 2])
    finally:
        if killer is not None:
            killer.cancel()
        kv.close()


def test_a_shared_replicated_store_survives_a_loss_during_run_and_after(handle3):
    ranks_before, pulled_before = _shared_run(handle3)
    ranks_after, pulled_after = _shared_run(handle3, kill=True)
    for rank_after, rank_before in zip(ranks_after, ranks_before, strict=True):
        for a, b in zip(rank_after, rank_before, strict=True):
            np.testing.assert_array_equal(a, b)
    for a, b in zip(pulled_after, pulled_before, strict=True):
        np.testing.assert_array_equal(a, b)  # this process's links failed over too


def test_a_replica_is_seeded_on_a_worker_that_joins_after_the_loss(handle3):
    handle3.client.wait_for_workers(3, timeout=60)
    kv = labkv.create("dist_async", cluster=handle3, num_servers=1, replicas=3, timeout=30)
    try:
        kv.init(0, np.zeros(2, np.float32))
        kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.1, momentum=0.9))
        replicas = kv.placement()[0][0]["replicas"]
        _kill(handle3, replicas[0])  # every worker holds a replica: none is free now
        reference = labkv.create("local")
        reference.init(0, np.zeros(2, np.float32))
        reference.set_optimizer(labkv.optimizers.SGD(learning_rate=0.1, momentum=0.9))
        deadline = time.monotonic() + 30

        def healed():
            now = kv.placement()[0][0]["replicas"]
            return len(now) == 3 and replicas[0] not in now

        while not healed() and time.monotonic() < deadline:
            for store in (kv, reference):
                store.push(0, np.ones(2, np.float32))
            np.testing.assert_array_equal(kv.pull(0), reference.pull(0))
            time.sleep(0.05)
        now = kv.placement()[0][0]["replicas"]
        assert len(now) == 3 and replicas[0] not in now  # the nanny's new worker holds one
    finally:
        kv.close()


def _push_only(handle, kill_at=None):
    """20 pushes of a small key with no pull between them (so several are in flight to
    the primary when it dies), then one pull; the final weights."""
    handle.client.wait_for_workers(2, timeout=60)
    kv = labkv.create("dist_sync", cluster=handle, num_servers=1, replicas=2, timeout=20)
    try:
        kv.init("w", np.zeros(4, np.float32))
        kv.set_optimizer("sgd", learning_rate=0.1, momentum=0.9)
        primary = kv.placement()["w"][0]["replicas"][0]
        for step in range(20):
            if step == kill_at:
                _kill(handle, primary)
            kv.push("w", np.full(4, np.sin(step), np.float32))
        weights = kv.pull("w")
        if kill_at is not None:  # until the nanny's new worker has joined
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                workers = handle.workers()
                if primary not in workers and len(workers) >= 2:
                    break
                time.sleep(0.1)
        return weights
    finally:
        kv.close()


def test_pushes_in_flight_to_a_killed_primary_are_not_waited_for_on_two_workers():
    # The pushes sent to the primary before it died were replayed to the new one; a
    # wait for them watched the new primary (alive) and gave up after the timeout.
    pytest.importorskip("distributed")
    from labkv.cluster import connect

    handle = connect(n_workers=2, dashboard_address=None, memory_limit="1GiB", set_as_default=False)
    try:
        undisturbed = _push_only(handle)
        for _ in range(3):  # it failed in about half of the runs
            started = time.monotonic()
            np.testing.assert_array_equal(_push_only(handle, kill_at=8), undisturbed)
            assert time.monotonic() - started < 20  # not after the store's 20 s timeout
    finally:
        handle.close()


def test_a_watched_store_counts_the_pushes_replayed_to_its_new_primary(handle3):
    # The new primary streams its events before the pushes not yet acknowledged are
    # replayed to it; it used to start streaming after the replay, so the monitor's
    # keys table missed every push of the failover.
    from labkv.widgets import monitor

    handle3.client.wait_for_workers(3, timeout=60)
    kv = labkv.create("dist_sync", cluster=handle3, num_servers=1, replicas=2, timeout=30)
    mon = monitor(kv)
    try:
        kv.init("w", np.zeros(4, np.float32))
        kv.set_optimizer("sgd", learning_rate=0.1, momentum=0.9)
        for step in range(20):
            if step == 8:  # the pushes before are in flight or held: most are replayed
                _kill(handle3, kv.placement()["w"][0]["replicas"][0])
            kv.push("w", np.full(4, np.sin(step), np.float32))
        kv.pull("w")

        def counted():
            mon.refresh()
            stats = mon.model.keys.get("w")
            return stats is not None and stats.pushes >= 12 and stats.updates >= 12

        # steps 8-19 reached only the new primary, which streams them
        assert wait_until(counted, timeout=10.0), mon.model.keys.get("w")
        assert mon.model.counts["failover"] == 1
    finally:
        mon.close()
        kv.close()


def _adding(key, grad, stored):
    """Every push applied adds its values (a count of pushes shows)."""
    stored += grad


COUNTED = [0, 1, 2, 3, 4, 5]  # over 3 servers: each server holds some


def _count_pushes(kv, steps, marker, staleness):
    """Rank r pushes a one at position r of every key each step, then pulls:
    position r of each key must be the rank's pushes so far, exactly (every
    push that returned is in the values, none twice). Rank 0 writes ``marker``
    at step 10 (the kill comes then). What every pull saw wrong, the pulls that
    saw a rank more than ``staleness`` behind (dist_ssp), and the final counts."""
    wrong, late = [], []
    one = np.zeros(2, np.float32)
    one[kv.rank] = 1.0
    kv.barrier()
    for step in range(steps):
        if step == 10 and kv.rank == 0:
            open(marker, "w").close()
        kv.push(COUNTED, [one] * len(COUNTED))
        seen = kv.pull(COUNTED)
        wrong += [
            (step, key, v.tolist()) for key, v in zip(COUNTED, seen) if v[kv.rank] != step + 1
        ]
        if staleness is not None and min(float(v.min()) for v in seen) < step + 1 - staleness:
            late.append((step, [v.tolist() for v in seen]))
        time.sleep(0.03)
    kv.barrier()
    return [v.tolist() for v in kv.pull(COUNTED)], wrong, late


@pytest.mark.parametrize("kind", ["dist_async", "dist_ssp"])
def test_async_and_ssp_lose_no_acknowledged_push_when_a_primary_s_worker_is_killed(
    handle3, kind, tmp_path
):
    """Two ranks push to a shared replicated store; the worker that hosts only
    servers (server 2's primary and server 1's backup) is SIGKILLed mid-run.
    Every pull holds every push its rank made before it, each once; the final
    values count every push of both ranks; dist_ssp (staleness 1) never let a
    pull see a rank more than the bound behind; the store failed over and
    re-seeded."""
    import threading

    from labkv.cluster import run

    steps, marker = 60, tmp_path / "marker"
    handle3.client.wait_for_workers(3, timeout=60)
    staleness = 1 if kind == "dist_ssp" else None
    kv = labkv.create(
        kind, cluster=handle3, num_servers=3, replicas=2, timeout=30, staleness=staleness
    )
    servers_only = handle3.workers()[2]  # ranks run on the first two workers
    killed = []

    def kill_mid_run():
        if wait_until(marker.exists, 60):
            _kill(handle3, servers_only)
            killed.append(time.monotonic())

    killer = threading.Thread(target=kill_mid_run, daemon=True)
    try:
        kv.init(COUNTED, [np.zeros(2, np.float32) for _ in COUNTED])
        kv.set_updater(_adding)
        pieces = [kv.placement()[key][0] for key in COUNTED]
        assert {piece["server"] for piece in pieces} == {0, 1, 2}
        on_victim = [p["server"] for p in pieces if p["replicas"][0] == servers_only]
        assert on_victim and set(on_victim) == {2}  # server 2's primary goes with it
        killer.start()
        got = run(_count_pushes, num_workers=2, kvstore=kv, args=(steps, str(marker), staleness))
        ended = time.monotonic()
        killer.join(timeout=60)
        assert killed and killed[0] < ended  # mid-run
        for final, wrong, late in got:
            assert wrong == []
            assert late == []
            assert final == [[steps, steps]] * len(COUNTED)
        assert [v.tolist() for v in kv.pull(COUNTED)] == [[steps, steps]] * len(COUNTED)
        on_2 = [key for key, piece in zip(COUNTED, pieces) if piece["server"] == 2]
        assert kv.placement()[on_2[0]][0]["replicas"][0] != servers_only  # failed over
    finally:
        kv.close()
