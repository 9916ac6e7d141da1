"""dist_sync / dist_async round bookkeeping (``labkv.cluster._server.rounds``) as plain
logic: no Dask, no event loop."""

from __future__ import annotations

import pytest

from labkv.cluster._errors import Failure, failed_update
from labkv.cluster._server.rounds import Round, SyncRounds, pushed_by
from labkv.cluster._server.sender_order import UpdateQueue


def _rounds(num_workers=3, keys=("w",)):
    rounds = SyncRounds(num_workers)
    for key in keys:
        rounds.add(key)
    return rounds


def test_the_last_rank_completes_a_round_whatever_the_order():
    rounds = _rounds()
    assert rounds.join("w", 2, "c", 0, 3.0, now=1.0) is False
    assert rounds.join("w", 0, "a", 5, 1.0, now=2.0) is False
    assert rounds.completes("w")
    assert rounds.join("w", 1, "b", 9, 2.0, now=3.0) is True
    r = rounds["w"]
    assert r.pending == {2: 3.0, 0: 1.0, 1: 2.0}
    assert r.senders == {"c": 0, "a": 5, "b": 9}
    assert r.first_push == 1.0  # when the round opened, for the round event


def test_the_timeout_message_names_the_ranks_that_have_not_pushed():
    rounds = _rounds(num_workers=4, keys=("w", "b"))
    rounds.join("w", 1, "b", 0, 1.0, now=0.0)
    rounds.join("w", 3, "d", 0, 1.0, now=0.0)
    assert rounds.missing("w") == "ranks [0, 2] have not pushed key 'w' in round 0"
    assert rounds.missing("b") == "ranks [0, 1, 2, 3] have not pushed key 'b' in round 0"
    rounds.join("w", 0, "a", 0, 1.0, now=0.0)
    rounds.join("w", 2, "c", 0, 1.0, now=0.0)
    rounds["w"].finish()
    assert rounds.missing("w") == "ranks [0, 1, 2, 3] have not pushed key 'w' in round 1"


def test_a_rank_a_round_ahead_waits_until_the_round_completes():
    rounds = _rounds(num_workers=2)
    rounds.join("w", 0, "a", 0, 1.0, now=0.0)
    assert rounds.ahead("w", 0) and not rounds.ahead("w", 1)
    rounds.join("w", 1, "b", 0, 1.0, now=0.0)
    rounds["w"].finish()
    assert not rounds.ahead("w", 0)


def test_a_pull_waits_for_the_round_its_senders_last_push_joined():
    rounds = _rounds(num_workers=2)
    assert rounds.pull_ready("a", "w") and not rounds.pushed("a", "w")  # never pushed
    rounds.join("w", 0, "a", 0, 1.0, now=0.0)
    assert rounds.pushed("a", "w") and not rounds.pull_ready("a", "w")
    assert rounds.pull_ready("notebook", "w")  # a watcher reads the last completed round
    rounds.join("w", 1, "b", 0, 1.0, now=0.0)
    rounds["w"].finish()
    assert rounds.pull_ready("a", "w") and rounds.pull_ready("b", "w")
    rounds.join("w", 0, "a", 1, 1.0, now=0.0)  # round 1
    assert not rounds.pull_ready("a", "w") and rounds.pull_ready("b", "w")


def test_the_number_of_ranks_changes_only_between_rounds():
    rounds = _rounds(num_workers=2)
    rounds.resize(3)
    assert rounds.num_workers == 3
    rounds.join("w", 0, "a", 0, 1.0, now=0.0)
    with pytest.raises(ValueError, match=r"keys \['w'\] have an open round"):
        rounds.resize(1)
    rounds.resize(3)  # the same number is fine
    rounds.drop_open()  # an aborted run
    assert rounds["w"].pending == {} and rounds["w"].done == 0
    rounds.resize(1)
    assert rounds.join("w", 0, "a", 1, 1.0, now=0.0) is True


def test_a_failed_round_is_reported_once_to_each_rank_that_pushed():
    rounds = _rounds(num_workers=2)
    rounds.join("w", 0, "a", 4, 1.0, now=0.0)
    rounds.join("w", 1, "b", 7, 1.0, now=0.0)
    senders = pushed_by(["w"], rounds)
    assert senders == {"a": {"w": 4}, "b": {"w": 7}}
    rounds["w"].finish(Failure(ValueError("bad"), server=1, keys=["w"], senders=senders))
    exc = rounds["w"].report_to("a")
    assert isinstance(exc, ValueError) and failed_update(exc) == (1, {"w": 4})
    assert rounds["w"].report_to("a") is None
    assert rounds["w"].report_to("notebook") is None
    assert rounds["w"].report_to("b") is not None


def test_round_failures_are_dropped_once_told():
    r = Round()
    r.join(0, "a", 0, 1.0)
    r.finish(Failure(ValueError("x"), 0, ["w"], {"a": {"w": 0}}))
    assert r.report_to("a") is not None
    r.finish()
    assert r.failures == {}


def test_dist_async_updates_of_a_sliced_key_follow_server_0s_order():
    leader, other = UpdateQueue(), UpdateQueue()
    # server 0 receives b's push first; the other server receives a's first
    leader.arrive("b", "vb", seq=0, leader=True)
    leader.arrive("a", "va", seq=0, leader=True)
    other.arrive("a", "va", seq=0, leader=False)
    other.arrive("b", "vb", seq=0, leader=False)
    assert other.take(0) is None  # not told the order yet
    for position in range(2):
        other.learn(position, leader.order[position])
    assert leader.take(0) == (("b", 0), "vb", 0)
    assert leader.take(1) is None  # one update at a time, until it is decided
    leader.decided("b")
    assert other.take(0) == (("b", 0), "vb", 0)
    other.decided("b")
    assert leader.take(1)[0] == other.take(1)[0] == ("a", 0)


def test_a_senders_lowest_unfinished_push_is_the_one_waiting_in_an_open_round():
    rounds = _rounds(num_workers=2, keys=("w", "b"))
    rounds.join("w", 0, "a", 4, 1.0, now=0.0)
    rounds.join("b", 0, "a", 6, 1.0, now=0.0)
    assert rounds.lowest_open("a", 9) == 4  # push 4 is not applied anywhere yet
    assert rounds.lowest_open("a", 3) == 3 and rounds.lowest_open("c", 9) == 9
    rounds.join("w", 1, "c", 0, 1.0, now=0.0)
    rounds["w"].finish()
    assert rounds.lowest_open("a", 9) == 6
