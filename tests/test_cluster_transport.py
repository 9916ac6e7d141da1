"""The seam (``labkv.cluster._transport``): ``base.wait_all``'s deadlines, lost
servers and server errors, on plain futures, and the Dask adapter's links and
helpers on fake actors and workers (no Dask)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest

from labkv.cluster._errors import CallTimedOut, ClusterError, ServerLost, mark_answer
from labkv.cluster._transport import base as _transport
from labkv.cluster._transport import dask as _dask
from labkv.cluster._transport.base import ServerLink, SingleServer, wait_all


class Link(ServerLink):
    def __init__(self, sid, why_lost=None):
        super().__init__(sid, f"tcp://worker-{sid}")
        self.why_lost = why_lost

    def lost(self):
        return self.why_lost


def _future(result=None, error=None):
    f = concurrent.futures.Future()
    if error is not None:
        f.set_exception(error)
    elif result is not None:
        f.set_result(result)
    return f


@pytest.fixture(autouse=True)
def _fast(monkeypatch):
    monkeypatch.setattr(_transport, "GRACE_S", 0.0)
    monkeypatch.setattr(_transport, "POLL_S", 0.01)


def test_results_come_back_in_call_order():
    calls = [(Link(1), _future("b")), (Link(0), _future("a"))]
    assert wait_all(calls, "pull", timeout=1.0) == ["b", "a"]


def test_a_silent_server_times_out_naming_it_and_the_call():
    start = time.monotonic()
    with pytest.raises(CallTimedOut, match=r"server 1 on tcp://worker-1 did not answer pull"):
        wait_all([(Link(1), _future())], "pull", timeout=0.1)
    assert time.monotonic() - start < 1.0


def test_a_server_the_scheduler_dropped_fails_at_once_as_lost():
    link = Link(0, why_lost="Worker holding Actor was lost (lost)")
    with pytest.raises(ServerLost, match=r"server 0 on Dask worker tcp://worker-0 is lost"):
        wait_all([(link, _future())], "push", timeout=30.0)


def test_a_servers_own_error_is_seen_then_raised_after_the_other_calls():
    error = mark_answer(ValueError("the updater raised"), 0)
    seen, later = [], _future()
    later.set_result("fine")
    with pytest.raises(ValueError, match="the updater raised"):
        wait_all([(Link(0), _future(error=error)), (Link(1), later)], "pull", 1.0, seen.append)
    assert seen == [error]


def test_a_connection_error_is_reported_as_a_lost_server():
    with pytest.raises(ServerLost, match="server 2 .* is lost .*connection refused"):
        wait_all([(Link(2), _future(error=OSError("connection refused")))], "init", 1.0)


def test_a_servers_own_oserror_is_its_answer_not_a_loss():
    error = mark_answer(OSError("the updater could not read its file"), 0)
    with pytest.raises(OSError, match="could not read its file") as raised:
        wait_all([(Link(0), _future(error=error))], "pull", 1.0)
    assert not isinstance(raised.value, ClusterError)


class CountedTending(SingleServer):
    """A plain link's failover that counts how often a wait tended it."""

    tended = 0

    def tend(self):
        self.tended += 1


class Tended(Link):
    """A link whose failover counts how often a wait tended it."""

    def __init__(self, sid):
        super().__init__(sid)
        self.failover = CountedTending(self.address)

    @property
    def tended(self):
        return self.failover.tended


def test_while_one_call_is_waited_for_the_other_links_of_the_wait_are_tended():
    waited, other = Tended(0), Tended(1)
    slow = concurrent.futures.Future()
    threading.Timer(0.1, slow.set_result, ["late"]).start()
    assert wait_all([(waited, slow), (other, _future("b"))], "pull", 5.0) == ["late", "b"]
    assert other.tended >= 3 and waited.tended == 0


class FailingOver(Link):
    """A link that fails over (its generation grows) at each of the first
    ``times`` looks whether it is lost."""

    def __init__(self, sid, times):
        super().__init__(sid)
        self.times = times

    def _raise_if_lost(self):
        if self.times:
            self.times -= 1
            self.failover.generation += 1


def test_a_wait_restarts_its_deadline_when_its_link_fails_over():
    slow = concurrent.futures.Future()
    threading.Timer(0.3, slow.set_result, ["made again, answered"]).start()
    link = FailingOver(0, times=1000)  # fails over at every look, until answered
    assert wait_all([(link, slow)], "pull", timeout=0.1) == ["made again, answered"]
    with pytest.raises(CallTimedOut):  # no failover: the deadline stands
        wait_all([(Link(0), concurrent.futures.Future())], "pull", timeout=0.1)


# -- the Dask adapter, on fakes ----------------------------------------------------------------
class FakeTask:
    status = "pending"


class FakeActor:
    """What the adapter reads of a Dask ``Actor`` handle (its internals, faked)."""

    def __init__(self, answer=None, raise_at_call=None):
        self._future, self._client, self._address = FakeTask(), None, "tcp://worker-0"
        self.key = "labkv-server-0"
        self.answer, self.raise_at_call = answer, raise_at_call

    def peek(self, keys):
        if self.raise_at_call is not None:
            raise self.raise_at_call
        return self.answer


class FakeWorker:
    def __init__(self, address, actors):
        self.address = address
        self.state = type("State", (), {"actors": actors})()


def test_an_actor_whose_worker_dask_dropped_is_a_lost_server():
    lost = _future(error=RuntimeError("Worker holding Actor was lost.  Status: lost"))
    link = _dask.ActorLink(0, "tcp://worker-0", FakeActor(answer=lost))
    with pytest.raises(ServerLost, match="server 0 on Dask worker tcp://worker-0 is lost"):
        link.call("peek", ["w"]).result(1)
    other = _future(error=RuntimeError("some other error"))
    link = _dask.ActorLink(0, "tcp://worker-0", FakeActor(answer=other))
    with pytest.raises(RuntimeError, match="some other error") as raised:
        link.call("peek", ["w"]).result(1)
    assert not isinstance(raised.value, ServerLost)
    actor = FakeActor(raise_at_call=RuntimeError("Worker holding Actor was lost"))
    with pytest.raises(ServerLost):
        _dask.ActorLink(0, "tcp://worker-0", actor).call("peek", ["w"])
    actor._future.status = "lost"
    assert _dask.ActorLink(0, "tcp://worker-0", actor).lost() == (
        "Worker holding Actor was lost (lost)"
    )


def test_the_same_worker_lookup_finds_an_actor_on_this_worker_only():
    server = object()
    worker = FakeWorker("tcp://here", {"labkv-server-0": server})
    assert _dask.actor_on(worker, "tcp://here", "labkv-server-0") is server
    assert _dask.actor_on(worker, "tcp://there", "labkv-server-0") is None
    assert _dask.actor_on(worker, "tcp://here", "labkv-server-1") is None
    assert _dask.actor_address(FakeActor()) == "tcp://worker-0"


def test_on_loop_is_true_only_on_the_thread_running_that_loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:

        async def here():
            return _dask.on_loop(loop)

        assert asyncio.run_coroutine_threadsafe(here(), loop).result(5) is True
        assert _dask.on_loop(loop) is False
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()
