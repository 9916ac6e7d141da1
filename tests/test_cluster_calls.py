"""A rank's calls (``labkv.cluster._rank.calls.Calls``) over fake links: one wait
path for plain and replicated links, errors of pushes in flight at the next
call, unanswered calls waited for before the next leaves, and what each link
is given to keep and to track."""

from __future__ import annotations

import numpy as np
import pytest

from labkv.cluster._errors import CallTimedOut, ServerLost, mark_answer
from labkv.cluster._protocol.messages import Push, PushHeader, pack
from labkv.cluster._rank.calls import Calls
from labkv.cluster._transport import base
from tests._fake_links import Group, PlainLink


@pytest.fixture(autouse=True)
def _fast(monkeypatch):
    monkeypatch.setattr(base, "GRACE_S", 0.0)
    monkeypatch.setattr(base, "POLL_S", 0.01)


def _push(calls: Calls, s: int, big: np.ndarray | None = None) -> Push:
    header = PushHeader(calls.sender, 0, calls.next_seq(s), ["w"], None, [], False, None)
    if big is None:
        return Push(header, pack([np.ones(2, np.float32)]), [])
    return Push(header._replace(big=[0]), None, [big])


def test_one_wait_path_fails_over_a_replicated_link_beside_a_plain_one():
    plain, g = PlainLink(0), Group(sid=1)
    calls = Calls([plain, g.link], timeout=1.0)
    g.replicas[0].fail["peek"] = [OSError("the connection broke")]
    waited = [(0, calls.call(0, "peek", ["a"])), (1, calls.call(1, "peek", ["b"]))]
    plain.futures[0].set_result("a from server 0")
    assert calls.wait(waited, "peek") == ["a from server 0", "peek by s1-r1"]
    assert g.link.generation == 1


def test_a_plain_links_lost_server_is_raised_as_lost():
    plain = PlainLink(0)
    calls = Calls([plain], timeout=1.0)
    future = calls.call(0, "peek", ["a"])
    future.set_exception(OSError("connection refused"))
    with pytest.raises(ServerLost, match="server 0 on Dask worker tcp://worker-0 is lost"):
        calls.wait([(0, future)], "peek")


def test_an_in_flight_pushs_error_surfaces_at_the_next_call_once():
    plain, seen = PlainLink(0), []
    calls = Calls([plain], timeout=1.0, on_server_error=seen.append)
    calls.push([(0, _push(calls, 0))], wait=False)  # not waited for
    assert len(calls.inflight) == 1
    error = mark_answer(ValueError("the updater raised"), 0)
    plain.futures[0].set_exception(error)
    with pytest.raises(ValueError, match="the updater raised"):
        calls.reap()
    assert seen == [error] and calls.inflight == []
    calls.reap()  # raised once


def test_a_timed_out_call_is_waited_for_before_the_next_call_leaves():
    plain = PlainLink(0)
    calls = Calls([plain], timeout=0.05)
    late = calls.call(0, "set_optimizer", {"sgd": 1})
    with pytest.raises(CallTimedOut, match="did not answer set_optimizer"):
        calls.wait([(0, late)], "set_optimizer")
    assert calls.interrupted == [(0, late)]
    late.set_exception(mark_answer(ValueError("the optimizer is refused"), 0))
    with pytest.raises(ValueError, match="the optimizer is refused"):
        calls.call(0, "peek", ["w"])  # the late answer is raised first: peek not sent
    assert [m for m, _ in plain.calls] == ["set_optimizer"]
    calls.call(0, "peek", ["w"])
    assert [m for m, _ in plain.calls] == ["set_optimizer", "peek"]


def test_every_push_is_given_to_its_link_to_keep_and_a_lent_one_as_a_copy():
    plain = PlainLink(0)
    calls = Calls([plain], timeout=1.0)
    small = _push(calls, 0)
    calls.send_pushes([(0, small)], wait=False)
    big = np.ones(4, np.float32)
    lent = _push(calls, 0, big)
    calls.send_pushes([(0, lent)], wait=True, keep_copies=True)
    (seq0, kept0), (seq1, kept1) = plain.kept
    assert (seq0, seq1) == (0, 1) and kept0 is small
    assert kept1.header == lent.header and kept1.bigs[0] is not big
    np.testing.assert_array_equal(kept1.bigs[0], big)
    assert [(m, a[0]) for m, a in plain.calls] == [("push", small), ("push", lent)]


class _Loop:
    """What a holding needs of a loop: this one never runs its timer."""

    def call_soon_threadsafe(self, fn, *args):
        pass


def test_a_held_push_is_tracked_by_its_link_and_rides_in_the_next_pull():
    plain = PlainLink(0, loop=_Loop(), answers={"pull": "values"})
    calls = Calls([plain], timeout=1.0)
    calls.send_pushes([(0, _push(calls, 0))], wait=False)
    assert plain.calls == [] and [m for m, _ in plain.tracked] == ["push"]
    (s, held) = calls.inflight[0]
    assert s == 0 and held is plain.tracked[0][1] and not held.done()
    assert calls.pull({0: ["w"]}) == ["values"]
    ((method, (pull,)),) = plain.calls
    assert method == "pull" and pull.seq == 1 and len(pull.pushes) == 1
    assert held.done() and calls.inflight == []
