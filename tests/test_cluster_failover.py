"""A rank's replicated link (``labkv.cluster._rank.failover``) owns its failover:
over fake replicas (functions that answer as a server would, recording every
call) and over real in-process replicas, a :class:`Call` that finds its
primary lost fails over and makes itself again, without the store's
``Calls``."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import numpy as np
import pytest

from labkv.cluster._errors import ServerLost, mark_answer, mark_failed_update
from labkv.cluster._protocol.messages import Pull
from labkv.cluster._rank import failover
from labkv.cluster._transport import base
from labkv.cluster._transport.base import wait_all
from tests._fake_links import SENDER, Group
from tests._inprocess import InProcessCluster
from tests._waiting import wait_until


def test_a_lost_primary_is_failed_over_inside_the_call():
    g = Group()
    primary, backup = g.replicas
    primary.fail["peek"] = [OSError("the connection broke")]
    assert g.link.call("peek", ["w"]).result(1) == "peek by s0-r1"
    assert backup.methods() == ["promote", "replay", "peek"]
    assert backup.calls[0][1] == ([("w0", "s0-r0")],)  # the lost primary named
    assert g.link.generation == 1 and g.link.address == "w1"
    # promoted before the replay; then, one replica short, it asks for a new one
    assert g.heard == [("promoted", "w1"), ("failover", "w0"), ("failover", None)]


def test_a_replica_pruned_as_dead_is_named_lost_when_a_later_one_is_promoted():
    """Three replicas; the scheduler's view drops the second (pruned), then the
    primary is lost: the third is promoted naming both, as a new primary
    refuses to take over while a replica before it is not known lost."""
    g = Group(n=3)
    primary, _, third = g.replicas
    g.link.prune({"w0", "w2"})
    primary.fail["peek"] = [OSError("the connection broke")]
    assert g.link.call("peek", ["w"]).result(1) == "peek by s0-r2"
    (lost,) = third.calls[0][1]
    assert set(lost) == {("w0", "s0-r0"), ("w1", "s0-r1")}


def test_a_push_is_not_made_again_the_replay_carries_it():
    g = Group()
    primary, backup = g.replicas
    pushes = ["push-0", "push-1"]
    for seq, msg in enumerate(pushes):
        g.link.keep(seq, msg)
    primary.fail["push"] = [OSError("the connection broke")]
    assert g.link.call("push", "push-1").result(1) is None
    assert backup.methods() == ["promote", "replay"]  # no push of its own
    assert backup.calls[1][1] == (SENDER, 0, pushes)


def test_a_pull_is_made_again_without_the_pushes_it_carried():
    g = Group()
    primary, backup = g.replicas
    primary.fail["pull"] = [OSError("the connection broke")]
    pull = Pull(SENDER, 3, ["w"], None, None, None, (b"a held push",))
    assert g.link.call("pull", pull).result(1) == "pull by s0-r1"
    assert backup.methods() == ["promote", "replay", "pull"]
    assert backup.calls[2][1] == (Pull(SENDER, 3, ["w"], None, None, None, ()),)


def test_a_failed_update_the_rank_was_told_of_is_not_raised_twice():
    g = Group()
    primary = g.replicas[0]

    def told(seqs):
        return mark_failed_update(mark_answer(ValueError("too big"), 0), 0, seqs)

    primary.fail["pull"] = [told({"w": 4}), told({"w": 4}), None, told({"w": 5})]
    pull = Pull(SENDER, 5, ["w"], None, None, None, ())
    with pytest.raises(ValueError, match="too big"):
        g.link.call("pull", pull).result(1)
    # told again (a new primary reports it again): the call is made again, once
    assert g.link.call("pull", pull).result(1) == "pull by s0-r0"
    assert primary.methods() == ["pull", "pull", "pull"]
    with pytest.raises(ValueError, match="too big"):  # another failure is raised
        g.link.call("pull", pull).result(1)


def test_a_call_on_a_dead_worker_fails_over_once_the_scheduler_says_so():
    dead: set[str] = set()
    g = Group(alive=lambda address: address not in dead)
    primary, backup = g.replicas
    primary.hang.add("peek")  # sits on the dead worker's connection
    call = g.link.call("peek", ["w"])
    with pytest.raises(TimeoutError):
        call.result(0.01)  # not answered yet, and nobody says the primary is lost
    assert backup.calls == []
    dead.add("w0")
    assert call.result(0.01) == "peek by s0-r1"
    assert g.link.generation == 1


def test_a_backup_the_scheduler_dropped_is_not_asked_to_take_over():
    """Both replicas' workers are gone and the scheduler says so, but the
    backup's link has not heard it (its actor's status lags on a busy
    machine): no promote is sent to the dead worker, whose connection would
    sit in Dask's connect retries; the lost error comes at once."""
    g = Group(alive=lambda address: False)
    primary, backup = g.replicas
    primary.fail["peek"] = [OSError("the connection broke")]
    backup.hang.add("promote")
    with pytest.raises(ServerLost, match=r"every replica .*\['w0', 'w1'\]"):
        g.link.call("peek", ["w"]).result(1)
    assert backup.calls == []


def test_a_promote_sitting_on_a_dead_worker_ends_when_the_scheduler_drops_it():
    """The scheduler drops the backup's worker only after the promote was
    sent (it sits on the dead worker's connection): the wait ends at the
    scheduler's word with the lost error, not at the link's timeout (300 s)."""
    dead = {"w0"}
    g = Group(alive=lambda address: address not in dead)
    g.link.timeout = 300.0
    primary, backup = g.replicas
    primary.fail["peek"] = [OSError("the connection broke")]
    backup.hang.add("promote")
    errors = []

    def call():
        try:
            g.link.call("peek", ["w"]).result(1)
        except ServerLost as exc:
            errors.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    assert wait_until(lambda: backup.methods() == ["promote"], timeout=30)
    dead.add("w1")
    caller.join(timeout=60)
    assert not caller.is_alive(), "the promote waited on after the scheduler dropped the backup"
    assert "every replica of it is gone" in str(errors[0])


def test_a_call_made_on_a_replaced_primary_is_made_again_on_the_new_one():
    g = Group()
    primary, backup = g.replicas
    primary.hang.add("peek")
    call = g.link.call("peek", ["w"])
    g.die(0)
    g.link.tend()  # another wait found the primary lost meanwhile
    assert g.link.generation == 1
    assert call.result(0.01) == "peek by s0-r1"


def test_losing_every_replica_names_the_server_and_its_workers():
    g = Group()
    g.die(0)
    g.die(1)
    with pytest.raises(ServerLost, match=r"server 0 is lost: every replica .*\['w0', 'w1'\]"):
        g.link.call("peek", ["w"]).result(1)


def test_a_broadcast_reaches_every_replica_and_only_a_backups_answer_fails_it():
    g = Group(n=3)
    _, second, third = g.replicas
    second.fail["abort"] = [OSError("this backup is gone")]
    assert g.link.call("abort", "stop").result(1) == "abort by s0-r0"
    assert all(r.methods() == ["abort"] for r in g.replicas)
    third.fail["configure"] = [mark_answer(ValueError("a round is open"), 0)]
    with pytest.raises(ValueError, match="a round is open"):
        g.link.call("configure", 2).result(1)
    assert g.replicas[0].methods() == ["abort", "configure"]
    assert g.link.call("peek", ["w"]).result(1) == "peek by s0-r0"  # the primary's alone
    assert second.methods() == third.methods() == ["abort", "configure"]


def test_a_reply_of_a_newer_epoch_has_the_link_learn_the_group():
    g = Group()
    primary = g.replicas[0]
    newcomer = ("w2", "s0-r2")
    primary.members.append(newcomer)
    primary.epoch = 1  # a replica was added to the group
    g.link.call("push", "p").result(1)
    assert primary.methods() == ["push", "members"]
    assert g.link.replicas() == ["w0", "w1", "w2"] and g.made == ["s0-r2"]
    g.link.call("push", "p").result(1)
    assert primary.methods() == ["push", "members", "push"]  # known now


def test_a_group_short_of_a_replica_asks_for_one_again_on_its_calls(monkeypatch):
    g = Group()
    g.replicas[0].fail["peek"] = [OSError("the connection broke")]
    g.link.call("peek", ["w"]).result(1)  # failed over: one replica left of 2
    assert g.heard[1:] == [("failover", "w0"), ("failover", None)]  # asked for a new one
    g.link.call("peek", ["w"]).result(1)
    assert g.heard.count(("failover", None)) == 1  # not again within RETRY_S
    monkeypatch.setattr(failover, "RETRY_S", 0.0)
    g.link._retry_at = 0.0
    g.link.call("peek", ["w"]).result(1)
    g.link.call("peek", ["w"]).result(1)
    assert g.heard.count(("failover", None)) == 3


def test_a_wait_fails_over_the_other_servers_of_the_wait(monkeypatch):
    """While server 0's call is waited for, server 1's lost primary is promoted:
    server 0 may need it (the slices of a key vote on each update)."""
    monkeypatch.setattr(base, "POLL_S", 0.01)
    g0, g1 = Group(sid=0), Group(sid=1)
    g1.die(0)
    answered = concurrent.futures.Future()

    def answer_once_server_1_has_failed_over():
        deadline = time.monotonic() + 5
        while g1.link.generation == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        answered.set_result("values of server 0")

    threading.Thread(target=answer_once_server_1_has_failed_over, daemon=True).start()
    second = g1.link.call("peek", ["b"])
    got = wait_all([(g0.link, answered), (g1.link, second)], "pull", timeout=5.0)
    assert got == ["values of server 0", "peek by s1-r1"]
    assert g1.replicas[1].methods()[:2] == ["promote", "replay"]


def test_a_tracked_held_push_whose_primary_is_lost_is_carried_by_the_replay():
    g = Group()
    held = concurrent.futures.Future()
    tracked = g.link.track("push", held)
    g.link.keep(0, "held push")
    held.set_exception(OSError("the connection broke"))  # its send failed
    assert tracked.result(1) is None
    assert g.replicas[1].calls[1] == ("replay", (SENDER, 0, ["held push"]))


def test_a_killed_in_process_primary_is_failed_over_by_its_links_call():
    with InProcessCluster("dist_sync", 1, 1, 5.0, replicas=2) as c:
        (kv,) = c.ranks
        kv.init("w", np.arange(3.0, dtype=np.float32))
        link = kv._links[0]
        c.group.kill(0)
        (value,) = link.call("peek", ["w"]).result(5)  # no store, no Calls
        np.testing.assert_array_equal(value, [0.0, 1.0, 2.0])
        assert link.generation == 1 and c.group.replicas_of[0][1].primary
