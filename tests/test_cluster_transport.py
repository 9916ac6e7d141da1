"""``labkv.cluster._transport.base.wait_all``: deadlines, lost servers and server errors,
on plain futures (no Dask)."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from labkv.cluster._errors import ClusterError
from labkv.cluster._transport import base as _transport
from labkv.cluster._transport.base import ServerLink, wait_all


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
    with pytest.raises(ClusterError, match=r"server 1 on tcp://worker-1 did not answer pull"):
        wait_all([(Link(1), _future())], "pull", timeout=0.1)
    assert time.monotonic() - start < 1.0


def test_a_server_the_scheduler_dropped_fails_at_once_as_lost():
    link = Link(0, why_lost="Worker holding Actor was lost (lost)")
    with pytest.raises(ClusterError, match=r"server 0 on Dask worker tcp://worker-0 is lost"):
        wait_all([(link, _future())], "push", timeout=30.0)


def test_a_servers_own_error_is_seen_then_raised_after_the_other_calls():
    error = ValueError("the updater raised")
    error._labkv_server = 0
    seen, later = [], _future()
    later.set_result("fine")
    with pytest.raises(ValueError, match="the updater raised"):
        wait_all([(Link(0), _future(error=error)), (Link(1), later)], "pull", 1.0, seen.append)
    assert seen == [error]


def test_a_connection_error_is_reported_as_a_lost_server():
    with pytest.raises(ClusterError, match="server 2 .* is lost .*connection refused"):
        wait_all([(Link(2), _future(error=OSError("connection refused")))], "init", 1.0)
