"""A rank lost for good and the run going on without it
(``on_rank_loss="shrink"``), without Dask: real ``Server``s in this process
(with and without replicas), real ``DistStore`` ranks in threads. The lost
rank's thread stops where it stands; its incarnation is fenced for good on
every server replica as ``run``'s watcher fences it, and the live rank's
barriers, dist_ssp pulls and sliced updates must go on, while every push the
lost rank made before counts once."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from labkv.cluster import run
from labkv.cluster._errors import ClusterError
from tests._inprocess import InProcessCluster
from tests._waiting import wait_until

KEYS = ["w", "big"]  # "big" is sliced over both servers (bigarray_bound=1000)
SIZES = {"w": 6, "big": 1500}
STEPS = 6


def _zeros():
    return [np.zeros(SIZES[k], np.float32) for k in KEYS]


def counting(key, grad, weight):
    """Every push applied adds its values (so a count of pushes shows)."""
    weight += grad


def _drop(c, rank):
    """What the watcher does with ``on_rank_loss="shrink"``: fence ``rank``'s
    incarnation 0 for good on every server replica."""
    group = c.ranks[0].spec.group
    rows = getattr(c.group, "replicas_of", None) or [[sv] for sv in c.servers]
    calls = [
        asyncio.run_coroutine_threadsafe(
            sv.fence(f"{group}/{rank}.0/", rank, 0.0, group), c.group.loop
        )
        for row in rows
        for sv in row
    ]
    for call in calls:
        call.result(5)


def _start(target, *args):
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("kind", ["dist_async", "dist_ssp"])
def test_the_live_rank_goes_on_past_barriers_and_clocks_without_a_dropped_rank(kind, replicas):
    """Rank 1 pushes two steps and is gone; rank 0, with a barrier and (in
    dist_ssp, staleness 0) a pull that waits for every rank's clock in each
    step, is held until rank 1 is dropped, then finishes alone."""
    kw = {"staleness": 0} if kind == "dist_ssp" else {}
    # replicated dist_ssp takes no custom updater on a sliced key: none sliced there
    kw["bigarray_bound"] = 10**6 if kind == "dist_ssp" and replicas > 1 else 1000
    with InProcessCluster(kind, 2, 2, timeout=5.0, replicas=replicas, **kw) as c:
        results, steps_done = {}, []

        def loop(kv, steps):
            if kv.rank == 0:
                kv.init(KEYS, _zeros())
                kv.set_updater(counting)
            kv.barrier()
            for step in kv.steps(steps):
                kv.push(KEYS, [np.ones(SIZES[k], np.float32) for k in KEYS])
                kv.pull(KEYS)
                kv.barrier()
                if kv.rank == 0:
                    steps_done.append(step.index)
            kv.flush()
            results[kv.rank] = kv.pull(KEYS)

        lost = _start(loop, c.ranks[1], 2)
        live = _start(loop, c.ranks[0], STEPS)
        lost.join(10)
        time.sleep(0.3)
        assert live.is_alive() and len(steps_done) <= 2  # held by the barrier of step 2
        _drop(c, 1)
        live.join(10)
        assert not live.is_alive()
        assert steps_done == list(range(STEPS))
        for key, value in zip(KEYS, results[0], strict=True):  # rank 0's 6 pushes, rank 1's 2
            assert np.all(value == STEPS + 2), key
        with pytest.raises(ClusterError, match="lost: the run goes on without it"):
            c.ranks[1].push("w", np.ones(SIZES["w"], np.float32))
            c.ranks[1].flush()


def test_a_sliced_update_whose_push_reached_one_server_commits_on_none():
    """dist_async with a custom updater: rank 1's push of a sliced key reaches
    server 0 only (its rank died between the two sends), so server 0 has
    placed it in the key's order and server 1 can never prepare it; rank 0's
    next push of the key waits behind it. Once rank 1 is dropped, server 1
    fails that update, it commits on no slice, and rank 0's updates go on:
    both slices hold rank 0's pushes only."""
    with InProcessCluster("dist_async", 2, 2, timeout=5.0, bigarray_bound=1000) as c:
        kv0, kv1 = c.ranks
        kv0.init(KEYS, _zeros())
        kv0.set_updater(counting)
        kv1.init(KEYS, _zeros())
        send = kv1._calls.send_pushes
        kv1._calls.send_pushes = lambda msgs, *a: send([m for m in msgs if m[0] == 0], *a)
        kv1.push("big", np.full(SIZES["big"], 100.0, np.float32))
        kv1._calls.inflight.clear()  # its process is gone: nobody waits for its replies
        loads = kv0.server_load()
        assert wait_until(
            lambda: kv0.server_load()[0]["messages"]["push"] > loads[0]["messages"]["push"]
        )

        done = threading.Event()

        def pushes():
            for _ in range(3):
                kv0.push("big", np.ones(SIZES["big"], np.float32))
            kv0.flush()
            done.set()

        _start(pushes)
        assert not done.wait(0.3)  # behind rank 1's half-arrived update
        _drop(c, 1)
        assert done.wait(5)
        np.testing.assert_array_equal(kv0.pull("big"), np.full(SIZES["big"], 3.0, np.float32))


def test_shrink_is_refused_for_dist_sync_before_anything_starts():
    with pytest.raises(ValueError, match="a dist_sync round sums every rank's push"):
        run(lambda kv: None, num_workers=2, kvstore="dist_sync", on_rank_loss="shrink")


def test_a_replica_seeded_after_the_drop_refuses_the_dropped_rank_too():
    """The fence travels in the seed: once the replicas that were told are
    gone, the one seeded after the drop refuses the lost rank as they did."""
    with InProcessCluster("dist_async", 1, 2, timeout=5.0, replicas=2) as c:
        kv0, kv1 = c.ranks
        kv0.init("w", np.zeros(3, np.float32))
        kv1.init("w", np.zeros(3, np.float32))
        _drop(c, 1)
        seeded = c.group.reseed(0)
        kv0.push("w", np.ones(3, np.float32))
        kv0.pull("w")  # rank 0 hears of the seeded replica
        c.group.kill(0, 0)  # the replicas that were told: the seeded one is the last
        c.group.kill(0, 1)
        kv0.push("w", np.ones(3, np.float32))
        np.testing.assert_array_equal(kv0.pull("w"), np.ones(3, np.float32))  # assigned
        assert seeded.primary and seeded.updates.gone == (f"{kv1.spec.group}/1.0/",)
        with pytest.raises(ClusterError, match="lost: the run goes on without it"):
            seeded.fences.check(kv1._calls.sender, 1)
        seeded.fences.check(kv0._calls.sender, 0)  # rank 0 is not refused
