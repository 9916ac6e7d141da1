"""Held small pushes (``labkv.cluster._rank.holding``): one exit, without Dask."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest

from labkv.cluster._rank.holding import Holding


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
