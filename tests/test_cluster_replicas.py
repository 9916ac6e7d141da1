"""Replicated servers without Dask: real ``Server`` replicas on one loop in this
process (``labkv.cluster._runtime.inprocess.InProcessReplicas``), real
``DistStore`` ranks, replicas killed mid-run, and the calls between servers
dropped, held back or cut by the in-process transport's fault hooks. Each test
runs in well under a second."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import labkv
from labkv.cluster._errors import ClusterError
from labkv.cluster._protocol.entries import Passed, decode_entry
from tests._inprocess import InProcessCluster
from tests._same_run import assert_same_run
from tests._waiting import in_threads, wait_until


def replicated(kind="dist_sync", num_servers=2, num_workers=2, replicas=2, **kw):
    """In-process servers with ``replicas`` copies each (2 unless told), ranks on them."""
    kw.setdefault("timeout", 5.0)
    return InProcessCluster(kind, num_servers, num_workers, replicas=replicas, **kw)


KEYS = ["w", "b", "big"]


def _shapes():
    return [np.zeros(3, np.float32), np.zeros(2, np.float32), np.zeros(40, np.float32)]


def _grad(step, rank, key):
    rng = np.random.default_rng(1000 * step + 10 * rank + KEYS.index(key))
    size = {"w": 3, "b": 2, "big": 40}[key]
    return rng.standard_normal(size).astype(np.float32)


def _train(c, steps, kill_at=None, kill=lambda c: c.group.kill(0)):
    """dist_sync SGD with momentum; ``kill(c)`` after ``kill_at`` steps. The
    final values and optimizer states of rank 0."""
    for kv in c.ranks:
        kv.init(KEYS, _shapes())
    c.ranks[0].set_optimizer(labkv.optimizers.SGD(learning_rate=0.1, momentum=0.9))

    def loop(kv):
        for step in range(steps):
            if step == kill_at and kv.rank == 0:
                kill(c)
            kv.push(KEYS, [_grad(step, kv.rank, k) for k in KEYS])
            outs = [np.empty_like(a) for a in _shapes()]
            kv.pull(KEYS, out=outs)
        return outs

    results = in_threads(*[lambda kv=kv: loop(kv) for kv in c.ranks])
    return results[0], c.ranks[0]._optimizer_states()


@pytest.mark.parametrize(
    ("kind", "replicas"),
    [
        ("dist_sync", 2),
        ("dist_async", 2),
        ("dist_sync", 3),
        ("dist_device_sync", 2),
        ("dist_async_device", 2),
        ("dist_ssp", 2),
    ],
)
def test_killing_a_primary_mid_run_changes_no_number(kind, replicas):
    # one rank pushing as it goes (dist_async, dist_ssp): a deterministic order
    num_workers = 1 if "async" in kind or kind == "dist_ssp" else 2
    kw = {"staleness": 1} if kind == "dist_ssp" else {}
    with replicated(kind, num_workers=num_workers, bigarray_bound=16, **kw) as c:
        undisturbed, states = _train(c, 12)
    with replicated(kind, num_workers=num_workers, bigarray_bound=16, replicas=replicas, **kw) as c:
        values, states_after = _train(c, 12, kill_at=5)
        assert c.group.servers_by_name(0)[0].primary  # the backup took over
    assert_same_run(values, states_after, undisturbed, states)


def _add(key, grad, stored):
    stored += grad


def _cut_after(c, sid, method):
    """Every rank's link to the primary of ``sid`` loses the reply of its next
    ``method`` call, after the server ran it (and the primary dies then)."""
    for kv in c.ranks:
        primary = kv._links[sid].primary
        primary.die_after = method


def test_a_push_applied_but_not_acknowledged_is_applied_once_after_failover():
    with replicated("dist_async", num_servers=1, num_workers=1, replicas=2) as c:
        (kv,) = c.ranks
        kv.init("w", np.zeros(4, np.float32))
        kv.set_updater(_add)
        kv.push("w", np.ones(4, np.float32))
        np.testing.assert_array_equal(kv.pull("w"), np.ones(4))
        primary = c.group.replicas_of[0][0]
        _cut_after(c, 0, "pull")  # the held push rides in the pull: applied, reply lost
        kv.push("w", np.full(4, 2.0, np.float32))
        c.group.host.dead.add(c.group.name_of(primary))
        got = kv.pull("w")
        np.testing.assert_array_equal(got, np.full(4, 3.0))  # 1 + 2, not 1 + 2 + 2
        assert c.group.replicas_of[0][1].primary
        assert kv._links[0].generation == 1


def test_a_big_push_whose_reply_is_lost_is_applied_once():
    with replicated("dist_async", num_servers=1, num_workers=1, replicas=2) as c:
        (kv,) = c.ranks
        big = np.zeros(1 << 18, np.float32)  # 1 MiB: a push that is waited for
        kv.init("w", big)
        kv.set_updater(_add)
        _cut_after(c, 0, "push")
        c.group.host.dead.add(c.group.name_of(c.group.replicas_of[0][0]))
        kv.push("w", np.ones_like(big))
        np.testing.assert_array_equal(kv.pull("w")[:4], np.ones(4))
        kv.push("w", np.ones_like(big))
        np.testing.assert_array_equal(kv.pull("w")[:4], np.full(4, 2.0))


def test_two_losses_in_a_row_with_a_reseed_between_are_survived():
    with replicated("dist_sync", num_servers=1, num_workers=1, replicas=2) as c:
        (kv,) = c.ranks
        kv.init("w", np.zeros(3, np.float32))
        kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.5, momentum=0.9))
        local = labkv.create("local")
        local.init("w", np.zeros(3, np.float32))
        local.set_optimizer(labkv.optimizers.SGD(learning_rate=0.5, momentum=0.9))
        for step in range(9):
            if step == 3:
                c.group.kill(0)
            if step == 5:
                c.group.reseed(0)
            if step == 7:
                c.group.kill(0)
            g = np.full(3, step + 1.0, np.float32)
            kv.push("w", g)
            local.push("w", g)
            np.testing.assert_array_equal(kv.pull("w"), local.pull("w"))
        assert kv._links[0].generation == 2
        assert c.group.replicas_of[0][2].primary  # the re-seeded replica


def _seeded_mid_round_run(c, disturb=None):
    """Two dist_sync ranks in a step loop on one server. With ``disturb``, in
    step 2, a new replica is seeded from the primary while the round of "w" is
    ``"open"`` (rank 0 pushed, rank 1 not yet) or ``"issued"`` (both pushed; the
    update applied and sent, its entry held on its way to the backup); the ranks
    learn of the new replica, then the primary and the old backup die: the new
    replica, promoted, must complete the round once (an open round's pushes are
    resent to it; an issued one is in its seed). Rank 0's values and states."""
    size = 1 << 14  # a push sent at once, not held back for the rank's next call
    armed, seeded, go = threading.Event(), threading.Event(), threading.Event()
    at_step, learned = (
        [threading.Event(), threading.Event()],
        [threading.Event(), threading.Event()],
    )
    primary, backup = (c.group.name_of(sv) for sv in c.group.replicas_of[0][:2])

    def loop(kv):
        kv.init("w", np.zeros(size, np.float32))
        if kv.rank == 0:
            kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.1, momentum=0.9))
        kv.barrier()
        out = np.empty(size, np.float32)
        for step in kv.steps(4):
            kv.pull("w", out=out)
            grad = 0.5 * out + step.rng.standard_normal(size).astype(np.float32)
            if step.number != 2 or disturb is None:
                kv.push("w", grad)
                continue
            at_step[kv.rank].set()
            assert armed.wait(10)
            if kv.rank == 0 or disturb == "issued":
                kv.push("w", grad)
            assert seeded.wait(10)
            kv._links[0].refresh()  # learns the group (as from a reply of its new epoch)
            learned[kv.rank].set()
            assert go.wait(10)
            if kv.rank == 1 and disturb == "open":
                kv.push("w", grad)
        kv.pull("w", out=out)
        return out

    def disturbing():
        assert all(e.wait(10) for e in at_step)
        held = None
        if disturb == "issued":  # its entry (and every later one) waits on its way to the backup
            held = c.group.host.delay("replicate", peer=backup, times=None)
        armed.set()
        rounds = c.group.replicas_of[0][0].rounds.rounds

        def reached():
            r = rounds.get("w")
            if r is None or r.done != 2:
                return False
            return r.issued if disturb == "issued" else 0 in r.pending

        assert wait_until(reached)
        c.group.reseed(0)
        seeded.set()
        assert all(e.wait(10) for e in learned)
        c.group.host.kill(primary)
        c.group.host.kill(backup)
        if held is not None:
            held.release()
        go.set()

    fns = [lambda kv=kv: loop(kv) for kv in c.ranks]
    if disturb is not None:
        fns.append(disturbing)
    outs = in_threads(*fns)
    return [outs[0]], c.ranks[0]._optimizer_states()


@pytest.mark.parametrize("disturb", ["open", "issued"])
def test_a_replica_seeded_mid_round_completes_the_round_once_promoted(disturb):
    with replicated("dist_sync", num_servers=1) as c:
        want, want_states = _seeded_mid_round_run(c)
    with replicated("dist_sync", num_servers=1) as c:
        got, states = _seeded_mid_round_run(c, disturb)
        assert c.group.replicas_of[0][2].primary  # the seeded replica took over
    assert_same_run(got, states, want, want_states)


def _replicas_named(c, sid):
    """What the scheduler would list: every live replica of ``sid``, by name."""
    return lambda s: [("in-process", c.group.name_of(sv)) for sv in c.group.servers_by_name(s)]


@pytest.mark.parametrize("seeded", [True, False])
def test_a_rank_that_has_not_heard_of_a_new_replica_finds_it_when_every_known_one_is_lost(
    seeded,
):
    with replicated("dist_sync", num_servers=1, num_workers=1, replicas=2) as c:
        (kv,) = c.ranks
        kv.init("w", np.zeros(3, np.float32))
        kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.5, momentum=0.9))
        local = labkv.create("local")
        local.init("w", np.zeros(3, np.float32))
        local.set_optimizer(labkv.optimizers.SGD(learning_rate=0.5, momentum=0.9))
        link = kv._links[0]
        link.find = _replicas_named(c, 0)
        for step in range(6):
            if step == 3:
                if seeded:
                    c.group.reseed(0)  # the rank's link hears nothing of it
                else:  # a replica that joined the group and was never seeded
                    g = c.group
                    (late,) = g.start(g.make_server, [0], ["server-0-late"])
                    members = [*g.members[0], ("in-process", "server-0-late")]
                    g._on_loop([late.join_group(members, len(members) - 1, False)])
                    g.replicas_of[0].append(late)
                c.group.kill(0, 0)
                c.group.kill(0, 1)
                assert len(link.members) == 2
            g = np.full(3, step + 1.0, np.float32)
            if not seeded and step == 3:
                with pytest.raises(ClusterError, match="server 0 is lost: every replica"):
                    kv.push("w", g)
                    kv.pull("w")
                return
            kv.push("w", g)
            local.push("w", g)
            np.testing.assert_array_equal(kv.pull("w"), local.pull("w"))
        assert c.group.replicas_of[0][2].primary  # the replica seeded after the rank's reply


def test_losing_every_replica_gives_the_lost_error_at_once():
    with replicated("dist_sync", num_servers=2, num_workers=1, replicas=2) as c:
        (kv,) = c.ranks
        kv.init([0, 1], [np.zeros(2), np.zeros(2)])
        server = kv.placement()[0][0]["server"]
        c.group.kill(server, 0)
        c.group.kill(server, 1)
        with pytest.raises(ClusterError, match=rf"server {server} is lost: every replica"):
            kv.pull(0)
        np.testing.assert_array_equal(kv.pull(1), np.zeros(2))  # the other server lives


def test_placement_names_each_pieces_replicas_primary_first():
    with replicated("dist_sync", num_servers=2, num_workers=1, replicas=2, bigarray_bound=4) as c:
        (kv,) = c.ranks
        kv.init("big", np.zeros(8))
        pieces = kv.placement()["big"]
        assert [len(p["replicas"]) for p in pieces] == [2, 2]


def test_a_custom_updater_on_a_sliced_ssp_key_is_refused_and_changes_nothing():
    with replicated(
        "dist_ssp", num_servers=2, num_workers=1, replicas=2, bigarray_bound=4, staleness=1
    ) as c:
        (kv,) = c.ranks
        kv.init("big", np.zeros(8))
        with pytest.raises(ValueError, match="custom updater on keys sliced"):
            kv.set_updater(lambda key, grad, stored: None)
        kv.push("big", np.ones(8))
        np.testing.assert_array_equal(kv.pull("big"), np.ones(8))  # still ASSIGN


def _decaying(key, grad, stored):
    """A custom updater whose result depends on every earlier update."""
    stored *= 0.9
    stored -= 0.1 * grad


def _train_with_updater(c, steps, kill_at=None, killed=0):
    """dist_sync with ``_decaying`` on keys of which "big" is sliced across both
    servers; the primary of server ``killed`` dies after ``kill_at`` steps."""
    for kv in c.ranks:
        kv.init(KEYS, _shapes())
    c.ranks[0].set_updater(_decaying)

    def loop(kv):
        outs = [np.empty_like(a) for a in _shapes()]
        for step in range(steps):
            if step == kill_at and kv.rank == 0:
                c.group.kill(killed)
            kv.push(KEYS, [_grad(step, kv.rank, k) for k in KEYS])
            kv.pull(KEYS, out=outs)
        return outs

    return in_threads(*[lambda kv=kv: loop(kv) for kv in c.ranks])[0]


@pytest.mark.parametrize("kind", ["dist_sync", "dist_async"])
@pytest.mark.parametrize("killed", [0, 1])
def test_a_custom_updater_on_a_sliced_key_survives_a_killed_primary(kind, killed):
    # one rank pushing as it goes (dist_async): a deterministic order
    workers = 2 if kind == "dist_sync" else 1
    with replicated(kind, num_workers=workers, bigarray_bound=16) as c:
        undisturbed = _train_with_updater(c, 12)
        assert len(c.ranks[0]._pieces["big"]) == 2  # sliced across both servers
    with replicated(kind, num_workers=workers, bigarray_bound=16) as c:
        values = _train_with_updater(c, 12, kill_at=5, killed=killed)
        assert c.group.servers_by_name(killed)[0].primary  # the backup took over
        backups = [c.group.replicas_of[s][1] for s in range(2)]
        assert [b.peers[killed] for b in backups] == [backups[killed].log.me] * 2
    for a, b in zip(values, undisturbed, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_sliced_update_that_fails_on_one_slice_changes_no_replica():
    def updater(key, grad, stored):
        if grad.max() > 10:  # only server 1's slice gets such values
            raise ValueError("too big")
        stored += grad

    with replicated(num_workers=1, bigarray_bound=4) as c:
        (kv,) = c.ranks
        kv.init("big", np.zeros(8, np.float32))
        kv.set_updater(updater)
        kv.push("big", np.ones(8, np.float32))
        kv.push("big", np.array([1, 1, 1, 1, 50, 50, 50, 50], np.float32))
        with pytest.raises(ValueError, match="too big"):
            kv.pull("big")
        np.testing.assert_array_equal(kv.pull("big"), np.ones(8))
        for s in range(2):
            for replica in c.group.replicas_of[s]:
                np.testing.assert_array_equal(replica.shard.values["big"], np.ones(4))


def test_replicas_are_checked_before_anything_starts():
    from labkv.cluster._options import check_replicas

    assert check_replicas(2) == 2
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ValueError, match="replicas must be a positive int"):
            check_replicas(bad)


def test_a_dist_ssp_failover_keeps_every_ranks_clocks():
    with replicated("dist_ssp", num_servers=1, num_workers=2, replicas=2, staleness=1) as c:
        r0, r1 = c.ranks
        for kv in c.ranks:
            kv.init("w", np.zeros(2, np.float32))
        r0.set_updater(_add)
        for _ in range(3):
            r0.push("w", np.ones(2, np.float32))
        r1.push("w", np.ones(2, np.float32))
        r0.flush(), r1.flush()
        primary, backup = c.group.replicas_of[0]
        assert backup.clocks.of("w") == primary.clocks.of("w") == {0: 3, 1: 1}
        c.group.kill(0)
        r1.push("w", np.ones(2, np.float32))
        r1.flush()  # fails over to the new primary, which takes the push
        # rank 0 at clock 3 may pull once rank 1 reaches 2: the new primary knows both
        np.testing.assert_array_equal(r0.pull("w"), [5.0, 5.0])
        assert backup.primary and backup.clocks.of("w") == {0: 3, 1: 2}
        seeded = c.group.reseed(0)
        assert seeded.clocks.of("w") == {0: 3, 1: 2}
        assert (
            seeded.clocks.ranks == backup.clocks.ranks == {r0._calls.sender: 0, r1._calls.sender: 1}
        )


def test_a_lost_backup_leaves_the_group_and_the_primary_carries_on():
    with replicated("dist_sync", num_servers=1, num_workers=1, replicas=2) as c:
        (kv,) = c.ranks
        kv.init("w", np.zeros(2, np.float32))
        kv.push("w", np.ones(2, np.float32))
        kv.pull("w")
        c.group.kill(0, 1)  # the backup
        for _ in range(3):
            kv.push("w", np.full(2, 2.0, np.float32))
            np.testing.assert_array_equal(kv.pull("w"), [2.0, 2.0])
        assert c.group.replicas_of[0][0].log.group.members == [("in-process", "server-0-0")]
        assert kv._links[0].generation == 0  # no failover: the primary lives


@pytest.mark.parametrize("kind", ["dist_sync", "dist_async"])
def test_an_updater_that_raises_changes_no_replica(kind):
    def updater(key, grad, stored):
        if grad[0] > 1:
            raise ValueError("too big")
        stored += grad

    with replicated(kind, num_servers=1, num_workers=1, replicas=2) as c:
        (kv,) = c.ranks
        kv.init("w", np.zeros(2, np.float32))
        kv.set_updater(updater)
        kv.push("w", np.ones(2, np.float32))
        kv.push("w", np.full(2, 5.0, np.float32))
        with pytest.raises(ValueError, match="too big"):
            kv.pull("w")
        load = kv.server_load()[0]
        assert load["primary"] is True and len(load["replicas"]) == 2
        c.group.kill(0)  # the backup has the same value: one update, not two
        np.testing.assert_array_equal(kv.pull("w"), [1.0, 1.0])


def test_a_big_push_kept_for_a_resend_is_a_copy_of_what_was_pushed():
    size = 1 << 18  # 1 MiB of float32: a push that is waited for, lent to the server
    with replicated("dist_sync", num_servers=1, num_workers=2, replicas=2) as c:
        r0, r1 = c.ranks
        for kv in c.ranks:
            kv.init("w", np.zeros(size, np.float32))
        grad = np.ones(size, np.float32)
        r0.push("w", grad)  # joins the open round; rank 1 has not pushed yet
        grad[:] = 999.0  # the caller may reuse its buffer once push returns
        c.group.kill(0)  # the round dies with the primary: rank 0's push is resent
        r1.push("w", np.full(size, 2.0, np.float32))
        got = in_threads(lambda: r0.pull("w"), lambda: r1.pull("w"))
        for value in got:
            np.testing.assert_array_equal(value[:3], [3.0, 3.0, 3.0])


def _too_big(key, grad, stored):
    if grad[0] > 10:
        raise ValueError("too big")
    stored += grad


def _fail_a_round(c, keys, sizes):
    """Both ranks push 6 to ``keys`` (rank 1 completing the round), whose update
    of 12 fails; rank 1 is told at once. The two ranks."""
    r0, r1 = c.ranks
    for kv in c.ranks:
        kv.init(keys, [np.zeros(n, np.float32) for n in sizes])
    r0.set_updater(_too_big)
    grads = [np.full(n, 6.0, np.float32) for n in sizes]
    r0.push(keys, grads)
    r0.flush()  # rank 0's push is in the round; rank 1's completes it
    r1.push(keys, grads)
    with pytest.raises(ValueError, match="too big"):
        r1.pull(keys[0])  # the round failed: told to the rank that completed it at once
    return r0, r1


@pytest.mark.parametrize("told_before_the_loss", [False, True])
def test_a_failed_round_reaches_each_rank_once_across_a_failover(told_before_the_loss):
    with replicated("dist_sync", num_servers=1, num_workers=2, replicas=2) as c:
        r0, r1 = _fail_a_round(c, ["w"], [2])
        if told_before_the_loss:
            with pytest.raises(ValueError, match="too big"):
                r0.pull("w")
        c.group.kill(0)  # the backup takes over, with what each rank was told
        if not told_before_the_loss:
            with pytest.raises(ValueError, match="too big"):
                r0.pull("w")  # still owed to rank 0, by the new primary
        for kv in (r0, r1):  # nobody is told twice; the value never changed
            np.testing.assert_array_equal(kv.pull("w"), [0.0, 0.0])


def test_a_failed_round_told_by_a_primary_that_died_before_noting_it_is_not_raised_again():
    with replicated("dist_sync", num_servers=1, num_workers=2, replicas=2) as c:
        r0, r1 = _fail_a_round(c, ["w"], [2])
        primary = c.group.replicas_of[0][0]
        # the note that it told rank 0 dies with the primary: it never reaches the backup
        lost = c.group.host.drop("replicate", caller=c.group.name_of(primary))
        with pytest.raises(ValueError, match="too big"):
            r0.pull("w")
        assert lost.seen == 1
        c.group.kill(0)  # the new primary still owes it to rank 0, and tells it again
        np.testing.assert_array_equal(r0.pull("w"), [0.0, 0.0])  # which raises it once
        (failure,) = c.group.replicas_of[0][1].rounds["w"].failures.values()
        assert failure.untold == {}  # owed to nobody now


def test_a_replica_seeded_after_a_failed_round_owes_it_to_the_same_ranks():
    with replicated("dist_sync", num_servers=1, num_workers=2, replicas=2) as c:
        r0, r1 = _fail_a_round(c, ["w", "b"], [2, 1])  # the round of both keys failed
        seeded = c.group.reseed(0)
        owed = seeded.rounds["b"].report_to(r0._calls.sender)
        assert isinstance(owed, ValueError) and "too big" in str(owed)
        # one failure for both keys: rank 0, told of it for "b", is not told again for "w"
        assert seeded.rounds["w"].report_to(r0._calls.sender) is None
        assert seeded.rounds["w"].report_to(r1._calls.sender) is None  # told before the seed


@pytest.mark.parametrize("mode", ["assign", "optimizer", "updater"])
def test_a_backup_shares_no_array_with_its_primary(mode):
    """A backup keeps the arrays of the entries it applies (no copy): they must
    be its own, never its primary's (in-process peers get copies, as over a wire)."""
    BIG = 1 << 15  # 128 KiB: its entry carries the array itself, not a pickled copy
    with replicated("dist_sync", num_servers=1, num_workers=1, replicas=2) as c:
        (kv,) = c.ranks
        kv.init(["w", "big"], [np.zeros(3, np.float32), np.zeros(BIG, np.float32)])
        if mode == "optimizer":
            kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.1, momentum=0.9))
        elif mode == "updater":
            kv.set_updater(_add)
        for step in range(3):
            kv.push(["w", "big"], [np.full(3, step, np.float32), np.full(BIG, step, np.float32)])
            kv.pull(["w", "big"])
        primary, backup = c.group.replicas_of[0]
        for key in ("w", "big"):
            mine = [primary.shard.read(key), *primary.shard._merge_buffers.values()]
            theirs = [backup.shard.read(key), *backup.shard._merge_buffers.values()]
            np.testing.assert_array_equal(theirs[0], mine[0])
            for a in mine:
                for b in theirs:
                    assert not np.shares_memory(a, b)


def _votes_of(number):
    """Matches a ``vote`` call's arguments ``[key, number, sid, error, push]`` of update ``number``."""
    return lambda args: args[1] == number


def _dies_with_its_vote(c, sid, number, sent):
    """The primary of ``sid`` dies as its vote of update ``number`` is due to
    go out, once every backup has it: before sending it (``sent=False``), or
    right after."""
    primary = next(sv for sv in c.group.servers_by_name(sid) if sv.primary)
    when = "sent" if sent else "before"
    c.group.host.die(c.group.name_of(primary), "vote", when, match=_votes_of(number))


def _async_updater_run(c, steps, fault=None):
    """One rank, dist_async, ``_decaying`` on keys of which "big" is sliced
    across both servers; ``fault(c)`` before the first push."""
    (kv,) = c.ranks
    kv.init(KEYS, _shapes())
    kv.set_updater(_decaying)
    if fault is not None:
        fault(c)
    outs = [np.empty_like(a) for a in _shapes()]
    for step in range(steps):
        kv.push(KEYS, [_grad(step, 0, k) for k in KEYS])
    kv.pull(KEYS, out=outs)
    return outs


def test_a_pull_waits_for_the_sliced_part_of_a_push_whose_whole_keys_are_logged():
    """A push of a whole key and a sliced one (custom updater, dist_async): the
    whole key's log entry goes out at once, the sliced key's update waits for
    the votes, held back here. A pull sent meanwhile reads the update: the
    push counts as arrived only once all of it is decided (not as its first
    log entry is issued)."""
    with replicated("dist_async", num_workers=1, bigarray_bound=16) as c:
        (kv,) = c.ranks
        kv.init(KEYS, _shapes())
        kv.set_updater(_decaying)
        c.group.host.delay("vote", seconds=0.2, times=None)
        grads = [_grad(0, 0, k) for k in KEYS]
        kv.push(KEYS, grads)
        time.sleep(0.05)  # the push leaves on its own (not carried by the pull)
        got = kv.pull("big")
        np.testing.assert_array_equal(got, np.float32(-0.1) * grads[2])


@pytest.mark.parametrize("sent", [False, True], ids=["unsent", "sent"])
@pytest.mark.parametrize("killed", [0, 1])
def test_a_primary_that_dies_with_its_vote_logged_loses_no_sliced_update(killed, sent):
    with replicated("dist_async", num_workers=1, bigarray_bound=16) as c:
        undisturbed = _async_updater_run(c, 8)
    with replicated("dist_async", num_workers=1, bigarray_bound=16) as c:
        values = _async_updater_run(c, 8, lambda c: _dies_with_its_vote(c, killed, 3, sent))
        assert c.group.servers_by_name(killed)[0].primary  # the backup took over
    for a, b in zip(values, undisturbed, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("killed", [0, 1])
def test_two_ranks_keep_a_sliced_key_in_one_order_across_a_failover(killed):
    """With 2 ranks the order of dist_async updates is the race's, but it must
    be one order for both slices: each rank pushes one constant, so once every
    update is committed (a pull does not wait for the other slices) every
    element of the key is equal, whatever the order."""
    with replicated("dist_async", num_workers=2, bigarray_bound=16) as c:
        for kv in c.ranks:
            kv.init("big", np.zeros(40, np.float32))
        c.ranks[0].set_updater(_decaying)

        def loop(kv):
            for step in range(12):
                if step == 4 and kv.rank == 0:
                    c.group.kill(killed)
                kv.push("big", np.full(40, kv.rank + 1.0, np.float32))
                kv.pull("big")  # a rank finds a lost primary by calling it

        in_threads(*[lambda kv=kv: loop(kv) for kv in c.ranks])
        assert wait_until(lambda: np.unique(c.ranks[0].pull("big")).size == 1, timeout=5)
        assert c.group.servers_by_name(killed)[0].primary


def _updates(key):
    """Matches a ``replicate`` call whose entry applies an update of ``key``."""
    return lambda args: any(k == key and v is not None for k, v in decode_entry(args[0]).updates)


def _drops_its_vote_then_dies_once_decided(c, sid, number):
    """The primary of ``sid`` loses its vote of update ``number`` (logged, but
    the message never leaves), decides the update all the same (it has the
    other server's vote), and dies once every backup has that update: the
    other server never got this vote, and the push is not resent."""
    primary = next(sv for sv in c.group.servers_by_name(sid) if sv.primary)
    name = c.group.name_of(primary)
    c.group.host.drop("vote", caller=name, match=_votes_of(number))
    # updates of "big" reach the backup in order: the number-th is update `number`
    c.group.host.die(name, "replicate", "answered", match=_updates("big"), skip=number)


def test_a_new_primary_sends_again_the_votes_its_old_primary_lost():
    with replicated("dist_async", num_workers=1, bigarray_bound=16) as c:
        undisturbed = _async_updater_run(c, 8)
    with replicated("dist_async", num_workers=1, bigarray_bound=16) as c:
        values = _async_updater_run(c, 8, lambda c: _drops_its_vote_then_dies_once_decided(c, 1, 3))
        assert c.group.servers_by_name(1)[0].primary
    for a, b in zip(values, undisturbed, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_primary_whose_backup_took_over_acknowledges_nothing_more():
    """A primary the ranks took for lost while it still runs (a partition):
    once its backup is the primary, the entries it issues are refused, and it
    acknowledges none (its votes and rounds stay open)."""
    with replicated("dist_sync", num_servers=1, num_workers=1) as c:
        (kv,) = c.ranks
        kv.init("w", np.zeros(2, np.float32))
        kv.push("w", np.ones(2, np.float32))
        kv.pull("w")
        old, backup = c.group.replicas_of[0]
        acked = old.log.acked
        # its next entry reaches the backup only once the backup took over
        held = c.group.host.delay("replicate", caller=c.group.name_of(old))
        kv.push("w", np.ones(2, np.float32))  # completes round 1 on the old primary
        assert wait_until(lambda: held.seen == 1, timeout=5)
        c.group.kill(0)  # unreachable for the ranks; it still runs
        np.testing.assert_array_equal(kv.pull("w"), [1.0, 1.0])  # failed over
        assert backup.primary
        held.release()
        assert wait_until(lambda: old.log.deposed, timeout=5)
        assert old.log.acked == acked and old.rounds["w"].done == 1  # round 1 never finished


def _passed_note(args: list) -> bool:
    return isinstance(decode_entry(args[0]).note, Passed)


@pytest.mark.parametrize("passed_note", ["forwarded", "lost with the primary"])
def test_a_barrier_whose_primary_dies_after_answering_one_rank_releases_the_other(passed_note):
    # Rank 0 passed the barrier; rank 1 completed it on the primary, which died
    # before answering it: rank 1 enters it again on the backup, which passes it
    # without rank 0, from the primary's note that it passed or, when the primary
    # died before that note left, from the arrivals every rank sent the backup.
    import threading
    import time

    with replicated("dist_sync", num_servers=1, num_workers=2, replicas=2, timeout=3.0) as c:
        if passed_note != "forwarded":
            c.group.host.drop("replicate", match=_passed_note)
        for kv in c.ranks:
            kv.init("w", np.zeros(2, np.float32))
        rank0, rank1 = c.ranks
        rank0_passed = threading.Event()

        def first():
            rank0.barrier()
            rank0_passed.set()
            rank0.barrier()  # the next generation, on the new primary

        def last():
            time.sleep(0.1)  # rank 0 is waiting in generation 0 by now
            rank1._links[0].primary.die_after = "barrier"
            start = time.monotonic()
            rank1.barrier()
            c.group.kill(0, replica=0)  # the old primary died then
            assert rank0_passed.wait(2)
            rank1.barrier()
            return time.monotonic() - start

        _, took = in_threads(first, last)
        assert took < 3.0  # not after the 3 s timeout
        assert c.group.servers_by_name(0)[0].primary  # the backup took over
        assert rank1._links[0].generation == 1


def test_a_barrier_every_backup_heard_of_is_not_logged_one_the_ranks_did_not_tell_is():
    # Each rank sends its arrival to the backups it knows: those pass the
    # generation on their own, so the primary logs nothing then, and only the
    # last generation passed a little later. A replica seeded before the ranks
    # know of it gets no arrival; the primary then logs that it passed the
    # generation at once, and that replica passes it from the log.
    with replicated("dist_sync", num_servers=1, num_workers=2, replicas=2) as c:
        for kv in c.ranks:
            kv.init("w", np.zeros(2, np.float32))
        primary, backup = c.group.replicas_of[0]
        issued = primary.log.issued
        in_threads(*[lambda kv=kv: [kv.barrier() for _ in range(3)] for kv in c.ranks])
        assert primary.log.issued == issued  # no log entry for a barrier
        assert wait_until(lambda: backup.barriers.passed == primary.barriers.passed, timeout=5)
        assert wait_until(lambda: primary.log.issued == issued + 1, timeout=5)  # the last, late

        seeded = c.group.reseed(0)
        issued = primary.log.issued
        in_threads(*[kv.barrier for kv in c.ranks])
        assert primary.log.issued == issued + 1  # the pass, for the replica nobody told
        assert wait_until(lambda: seeded.barriers.passed == primary.barriers.passed, timeout=5)
        assert backup.barriers.passed == primary.barriers.passed


@pytest.mark.parametrize("setting", ["optimizer", "updater"])
def test_a_replica_seeded_before_the_rank_knows_it_gets_init_and_settings_through_the_log(
    setting,
):
    """A replica joins (seeded by the primary, as after a lost worker) before the
    rank has heard of it: the rank's init and optimizer (or updater) reach it
    all the same, through its primary's log, and it ends with the primary's
    values and states."""
    with replicated("dist_sync", num_workers=1) as c:
        (kv,) = c.ranks
        seeded = c.group.reseed(0)
        kv.init(KEYS, _shapes())
        if setting == "optimizer":
            kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.1, momentum=0.9))
        else:
            kv.set_updater(_decaying)
        for step in range(3):
            kv.push(KEYS, [_grad(step, 0, k) for k in KEYS])
            kv.pull(KEYS)
        primary = c.group.replicas_of[0][0]
        assert primary.primary and set(seeded.meta) == set(primary.meta) != set()
        for key in primary.meta:
            np.testing.assert_array_equal(seeded.shard.read(key), primary.shard.read(key))
        if setting == "optimizer":
            assert seeded.shard.optimizer.to_config() == primary.shard.optimizer.to_config()
            mine, theirs = primary.settings.get_states(), seeded.settings.get_states()
            assert mine[:2] == theirs[:2]
            for key, states in mine[2].items():
                for a, b in zip(states, theirs[2][key], strict=True):
                    np.testing.assert_array_equal(a, b)
        else:
            assert seeded.shard.updater is not None
