"""Held small pushes (``labkv.cluster._rank.holding``): one exit, without Dask;
then on a real cluster, a rank folds a small push into its next pull of the same
server, a timer sends it on its own when no call follows, and every other call
sends it first. Nothing there is timed: a held push that never went out would make
the other rank's round time out (the runs' ``timeout`` turns that into an error)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import numpy as np
import pytest

from labkv.cluster import run
from labkv.cluster._rank.holding import Holding

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class Sender:
    """Records what is sent; each send's future is settled by the test."""

    def __init__(self, fail_on=None):
        self.sent, self.futures, self.fail_on = [], [], fail_on

    def __call__(self, server, msg):
        if server == self.fail_on:
            raise RuntimeError(f"server {server} is lost")
        self.sent.append((server, msg))
        f = concurrent.futures.Future()
        self.futures.append(f)
        return f


def test_a_pull_carries_its_servers_pushes_in_order_and_sends_the_rest():
    send = Sender()
    h = Holding(send, loop=None)
    f = [h.hold(0, "p0"), h.hold(1, "q0"), h.hold(0, "p1")]
    carried = h.release(carry={0})
    assert carried == {0: ["p0", "p1"]}
    assert send.sent == [(1, "q0")]
    assert f[0].done() and f[2].done() and not f[1].done()
    send.futures[0].set_result(None)
    assert f[1].result(timeout=1) is None
    assert not h and h.release() == {}


def test_a_sent_push_passes_its_error_to_its_future():
    send = Sender()
    h = Holding(send, loop=None)
    f = h.hold(0, "p")
    h.release()
    send.futures[0].set_exception(ValueError("updater failed"))
    with pytest.raises(ValueError, match="updater failed"):
        f.result(timeout=1)


def test_a_push_to_a_lost_server_fails_its_future_and_the_others_still_go():
    send = Sender(fail_on=1)
    h = Holding(send, loop=None)
    lost, kept = h.hold(1, "x"), h.hold(0, "y")
    h.release()
    with pytest.raises(RuntimeError, match="server 1 is lost"):
        lost.result(timeout=1)
    assert send.sent == [(0, "y")] and not kept.done()


def test_the_timer_sends_held_pushes_after_the_hold_time():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        send = Sender()
        h = Holding(send, loop, hold_s=0.05)
        h.hold(0, "a")
        time.sleep(0.01)
        assert send.sent == []  # not yet
        deadline = time.monotonic() + 2
        while not send.sent and time.monotonic() < deadline:
            time.sleep(0.01)
        assert send.sent == [(0, "a")] and not h
        h.hold(0, "b")  # the timer arms again for the next burst
        deadline = time.monotonic() + 2
        while len(send.sent) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert send.sent == [(0, "a"), (0, "b")]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()


def test_a_held_push_to_a_lost_replicated_primary_settles_without_failing_over():
    """The done-callback runs on the link's loop, where no failover may wait: the
    held push's future gets the call's own error; its waiter fails over later."""
    from tests._fake_links import Group

    g = Group()
    g.replicas[0].fail["push"] = [OSError("the connection broke")]
    h = Holding(lambda s, msg: g.link.call("push", msg), loop=None)
    held = h.hold(0, "p")
    h.release()
    with pytest.raises(OSError, match="the connection broke"):
        held.result(timeout=1)
    assert g.replicas[1].calls == [] and g.link.generation == 0
    g.link.keep(0, "p")
    assert g.link.track("push", held).result(1) is None  # the waiter fails over
    assert [m for m, _ in g.replicas[1].calls] == ["promote", "replay"]


# -- on a real cluster (held pushes end to end) ----------------------------------
def _push_then_wait_outside_the_store(kv, holder, event):
    import distributed

    kv.init(0, np.zeros(3))
    kv.push(0, np.full(3, kv.rank + 1.0))
    done = distributed.Event(event)
    if kv.rank == holder:
        # No call on the store: only the hold timer can send this rank's push.
        return done.wait(timeout=60), None
    value = kv.pull(0)  # completes only once the holder's push reached the server
    done.set()
    return True, value


@pytest.mark.parametrize("holder", [0, 1], ids=["server-on-own-worker", "remote-server"])
def test_a_push_with_no_following_call_still_reaches_the_servers(handle, holder):
    # S = 1: the server lives on rank 0's worker (rank 0 calls it in-process).
    results = run(
        _push_then_wait_outside_the_store,
        num_workers=2,
        num_servers=1,
        cluster=handle,
        timeout=20,
        args=(holder, f"labkv-test-held-{holder}"),
    )
    assert all(released for released, _ in results)
    np.testing.assert_array_equal(results[1 - holder][1], np.full(3, 3.0))


def _push_then_barrier(kv):
    kv.init("w", np.zeros(2))
    kv.push("w", np.full(2, kv.rank + 1.0))
    if kv.rank == 0:
        kv.barrier()  # rank 1's pull waits for this rank's push: the barrier sends it
        return kv.pull("w")
    value = kv.pull("w")
    kv.barrier()
    return value


def test_a_sync_round_completes_when_a_rank_pushes_then_waits_at_a_barrier(handle):
    for value in run(_push_then_barrier, num_workers=2, num_servers=2, cluster=handle, timeout=20):
        np.testing.assert_array_equal(value, [3.0, 3.0])


def _digits(key, merged, stored):  # order-sensitive: stored becomes its digits then merged
    stored *= 10
    stored += merged


def _ordered(kv):
    # Key 0 lives on server 0 (on this rank's worker), key 1 on server 1 (remote).
    kv.init([0, 1], [np.zeros(2), np.zeros(2)])
    kv.set_updater(_digits)
    for d in (1, 2):
        kv.push([0, 1], [np.full(2, float(d))] * 2)  # held, two per server
    first = kv.pull(1)  # carries server 1's pushes; server 0's go out on their own
    kv.push(0, np.full(2, 3.0))
    kv.init(2, np.zeros(1 << 18, dtype=np.float32))  # sends the held push first
    kv.push(1, np.full(2, 3.0))
    kv.push(2, np.ones(1 << 18, dtype=np.float32))  # >= 1 MiB: waited for, held go first
    kv.push(0, np.full(2, 4.0))
    kv.barrier()  # W = 1: no wait, but held pushes go first
    kv.push([0, 1], [np.full(2, 5.0), np.full(2, 4.0)])
    outs = [np.empty(2), np.empty(2)]
    kv.pull([0, 1], out=outs)
    return first, outs, [load["messages"] for load in kv.server_load()]


def test_held_pushes_keep_their_order_with_every_other_call(handle):
    [(first, (zero, one), messages)] = run(
        _ordered, num_workers=1, num_servers=2, kvstore="dist_async", cluster=handle, timeout=20
    )
    np.testing.assert_array_equal(first, [12.0, 12.0])
    np.testing.assert_array_equal(zero, [12345.0, 12345.0])
    np.testing.assert_array_equal(one, [1234.0, 1234.0])
    # A folded push still counts as one push message of its server.
    assert sum(m["push"] for m in messages) == 4 + 3 + 1 + 2
    assert sum(m["pull"] for m in messages) == 3


def _refuse_big(key, merged, stored):
    if merged[0] > 1:
        raise ValueError(f"refused {merged[0]:g}")
    stored += merged


def _failing_held_push(kv, via_barrier):
    kv.init([0, 1], [np.zeros(2), np.zeros(2)])
    kv.set_updater(_refuse_big)
    got = []
    for key in (0, 1):  # server 0 in-process, server 1 remote
        kv.push(key, np.full(2, 5.0))  # held; fails on the server
        surfaced = "at the next push"
        try:
            # Raises the first push's error if its reply is already in (the hold's
            # timer sent it on a busy machine), and then sends nothing.
            kv.push(key, np.ones(2))
            surfaced = "at the next call"
            kv.barrier() if via_barrier else kv.pull(key)
            got.append(("never", ""))
        except Exception as exc:
            got.append((surfaced, f"{type(exc).__name__}: {exc}"))
        got.append(kv.pull(key).tolist())
    return got


@pytest.mark.parametrize("via_barrier", [False, True], ids=["next-pull", "next-barrier"])
def test_the_error_of_a_held_push_surfaces_at_the_next_call(handle, via_barrier):
    """The refused push's error is raised by the rank's next call: the next push
    (which then sends nothing) if the refusal is back by then, else the pull or
    barrier (and the next push, held after the refused one, is applied)."""
    [got] = run(
        _failing_held_push,
        num_workers=1,
        num_servers=2,
        kvstore="dist_async",
        cluster=handle,
        timeout=20,
        args=(via_barrier,),
    )
    assert len(got) == 4, got
    for (surfaced, error), value in (got[0:2], got[2:4]):
        assert surfaced != "never" and "refused 5" in error, got
        assert value == ([1.0, 1.0] if surfaced == "at the next call" else [0.0, 0.0]), got
