"""Near reads: a rank pulls a replicated server's keys from the backup on its
own worker, once that backup applied the updates of the rank's pushes (and, in
dist_ssp, every rank is within the staleness bound by the backup's clocks)
(``labkv.cluster._rank.failover``, ``labkv.cluster._server.replication.reads``).

In-process replicas with ``wire=False`` make every server "in this process", as
a backup on a rank's own worker is; the last test runs ranks on a real
LocalCluster, where the link to such a backup is Dask's in-process one."""

from __future__ import annotations

import concurrent.futures
import contextlib
import time

import numpy as np
import pytest

import labkv
from labkv.cluster._rank.failover import ReplicatedLink
from tests._inprocess import InProcessCluster
from tests._same_run import assert_same_run
from tests.test_cluster_replicas import _train


def near(kind="dist_sync", num_servers=1, replicas=2, num_workers=2, **kw):
    """Replicated in-process servers that every rank reaches in-process."""
    kw.setdefault("timeout", 5.0)
    return InProcessCluster(kind, num_servers, num_workers, replicas=replicas, wire=False, **kw)


def _pulls(servers):
    return [sv.reports.messages["pull"] for sv in servers]


@contextlib.contextmanager
def _two_workers():
    """A LocalCluster of two workers, and ``labkv.cluster.run``."""
    pytest.importorskip("distributed")
    from labkv.cluster import connect, run

    with connect(n_workers=2, dashboard_address=None, memory_limit="1GiB") as handle:
        yield handle, run


@contextlib.contextmanager
def _ssp_ranks(**kw):
    """Two dist_ssp ranks (staleness 0) on near-read replicas, key "w" at zeros,
    updated by adding each push."""
    with near("dist_ssp", staleness=0, **kw) as c:
        for kv in c.ranks:
            kv.init("w", np.zeros(3, np.float32))
        c.ranks[0].set_updater(_adding)
        yield c


def _adding(key, grad, stored):
    stored += grad


def test_a_pull_waits_on_the_backup_until_it_applied_the_round_then_reads_it_there():
    with near() as c:
        r0, r1 = c.ranks
        for kv in c.ranks:
            kv.init("w", np.zeros(3, np.float32))
        primary, backup = c.group.replicas_of[0]
        held = c.group.host.delay("replicate")  # the round's entry waits on its way
        r0.push("w", np.ones(3, np.float32))
        r1.push("w", np.full(3, 2.0, np.float32))
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            pulls = [pool.submit(kv.pull, "w") for kv in c.ranks]
            time.sleep(0.3)
            # The primary completed the round; the backup has not applied it.
            assert not any(p.done() for p in pulls)
            np.testing.assert_array_equal(primary.shard.read("w"), [3.0, 3.0, 3.0])
            held.release()
            for p in pulls:
                np.testing.assert_array_equal(p.result(timeout=10), [3.0, 3.0, 3.0])
        assert _pulls([primary, backup]) == [0, 2]  # both read on the backup


def test_a_primary_lost_before_its_backup_got_the_round_is_failed_over_by_the_waiting_read():
    with near() as c:
        for kv in c.ranks:
            kv.init("w", np.zeros(3, np.float32))
        c.group.host.delay("replicate")  # never released: the entry dies with the primary
        for kv in c.ranks:
            kv.push("w", np.full(3, kv.rank + 1.0, np.float32))
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            pulls = [pool.submit(kv.pull, "w") for kv in c.ranks]
            time.sleep(0.2)
            c.group.kill(0)  # the backup is promoted, the ranks' pushes replayed to it
            for p in pulls:
                np.testing.assert_array_equal(p.result(timeout=10), [3.0, 3.0, 3.0])
        (survivor,) = c.group.servers_by_name(0)
        assert survivor.primary
        np.testing.assert_array_equal(survivor.shard.read("w"), [3.0, 3.0, 3.0])


@pytest.mark.parametrize("kind", ["dist_sync", "dist_async", "dist_ssp"])
def test_killing_the_primary_while_ranks_read_from_its_backup_changes_no_number(kind):
    # one rank pushing as it goes in dist_async and dist_ssp: a deterministic order
    kw = {"num_servers": 2, "bigarray_bound": 16, "num_workers": 2}
    if kind != "dist_sync":
        kw["num_workers"] = 1
    if kind == "dist_ssp":
        kw["staleness"] = 0
    with near(kind, **kw) as c:
        undisturbed, states = _train(c, 12)
        backups = [c.group.replicas_of[s][1] for s in range(2)]
        assert all(n > 0 for n in _pulls(backups)), "the backups answered no pull"
    with near(kind, **kw) as c:
        values, states_after = _train(c, 12, kill_at=5)
        assert c.group.servers_by_name(0)[0].primary  # the backup took over
    assert_same_run(values, states_after, undisturbed, states)


def test_a_dist_async_pull_waits_on_the_backup_for_the_rank_s_own_pushes_only():
    with near("dist_async") as c:
        r0, r1 = c.ranks
        for kv in c.ranks:
            kv.init("w", np.zeros(3, np.float32))
        primary, backup = c.group.replicas_of[0]
        r0.push("w", np.ones(3, np.float32))
        np.testing.assert_array_equal(r0.pull("w"), [1.0, 1.0, 1.0])  # its own push
        held = c.group.host.delay("replicate")
        r1.push("w", np.full(3, 2.0, np.float32))
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pull = pool.submit(r1.pull, "w")
            time.sleep(0.3)
            assert not pull.done()  # rank 1's push is not on the backup yet
            # rank 0 pushed nothing since: it reads what the backup has, on both replicas
            np.testing.assert_array_equal(r0.pull("w"), [1.0, 1.0, 1.0])
            held.release()
            np.testing.assert_array_equal(pull.result(timeout=10), [2.0, 2.0, 2.0])  # assigned
        assert _pulls([primary, backup]) == [0, 3]


@pytest.mark.parametrize("kind", ["dist_sync", "dist_async"])
def test_a_big_value_read_on_the_backup_is_the_rank_s_own(kind):
    # 2 MiB: above the size a server sends without a copy when nothing may change it
    with near(kind, num_workers=1, bigarray_bound=1 << 30) as c:
        kv = c.ranks[0]
        kv.init("w", np.zeros(1 << 19, np.float32))
        kv.set_optimizer(labkv.optimizers.SGD(learning_rate=1.0))  # updates in place
        kv.push("w", np.ones(1 << 19, np.float32))
        first = kv.pull("w")
        kv.push("w", np.ones(1 << 19, np.float32))
        np.testing.assert_array_equal(kv.pull("w")[:3], [-2.0, -2.0, -2.0])
        np.testing.assert_array_equal(first[:3], [-1.0, -1.0, -1.0])  # not the server's
        assert _pulls(c.group.replicas_of[0]) == [0, 2]


def test_a_dist_ssp_pull_on_the_backup_waits_for_the_slowest_rank_by_the_backup_s_clocks():
    with _ssp_ranks() as c:
        r0, r1 = c.ranks
        primary, backup = c.group.replicas_of[0]
        r0.push("w", np.ones(3, np.float32))
        deadline = time.monotonic() + 5
        while backup.clocks.clock("w", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # rank 0's push reaches the backup
        held = c.group.host.delay("replicate")
        r1.push("w", np.full(3, 2.0, np.float32))
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pull = pool.submit(r0.pull, "w")
            time.sleep(0.3)
            # The primary applied rank 1's push, so its clocks let rank 0 read; the
            # backup has not, and its clocks (which follow its values) do not.
            assert primary.clocks.ready("w", 0) and not backup.clocks.ready("w", 0)
            assert not pull.done()
            held.release()
            np.testing.assert_array_equal(pull.result(timeout=10), [3.0, 3.0, 3.0])
        np.testing.assert_array_equal(r1.pull("w"), [3.0, 3.0, 3.0])
        assert _pulls([primary, backup]) == [0, 2]


def test_a_dist_ssp_read_that_outwaits_its_timeout_names_the_slowest_rank_and_changes_nothing():
    with _ssp_ranks(timeout=1.0) as c:
        r0, r1 = c.ranks
        r0.push("w", np.ones(3, np.float32))
        with pytest.raises(Exception, match="slowest: rank 1 at clock 0"):
            r0.pull("w")
        r1.push("w", np.full(3, 2.0, np.float32))
        for kv in c.ranks:
            np.testing.assert_array_equal(kv.pull("w"), [3.0, 3.0, 3.0])
        primary, backup = c.group.replicas_of[0]
        assert _pulls([primary]) == [0] and _pulls([backup])[0] >= 2


async def _flushed(*servers):
    for server in servers:
        server.stream.flush()


def test_a_replica_seeded_while_the_store_is_watched_streams_its_near_reads_events():
    import pickle

    with _ssp_ranks() as c:
        primary, backup = c.group.replicas_of[0]
        c.group._on_loop([sv.streaming(True, 0.5, 2) for sv in (primary, backup)])
        c.group.kill(0, replica=1)  # the backup is lost (the primary drops it at its
        for kv in c.ranks:  # next update's forward), and a new one is seeded
            kv.push("w", np.ones(3, np.float32))
        deadline = time.monotonic() + 5
        while len(primary.log.group.members) > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        seeded = c.group.reseed(0)
        assert seeded.stream.settings == (0.5, 2) == primary.stream.settings
        for _ in range(2):  # the first round's replies tell the ranks of the new replica
            c.group._on_loop([_flushed(primary, seeded)])  # what the rounds before sent
            c.group.host.events.clear()
            answered = _pulls([primary, seeded])
            for kv in c.ranks:
                kv.push("w", np.ones(3, np.float32))
            for kv in c.ranks:
                kv.pull("w")
        assert [b - a for a, b in zip(answered, _pulls([primary, seeded]))] == [0, 2]
        c.group._on_loop([sv.streaming(False) for sv in (primary, seeded)])  # flushes
        sent = [e for _, batch in c.group.host.events for e in pickle.loads(batch)]
        # the primary answered none of these pulls: the clocks are the new replica's
        assert sum(e.get("count", 1) for e in sent if e["op"] == "clock") == 2
        loads = [e["extra"] for e in sent if e["op"] == "load" and not e["extra"]["primary"]]
        assert loads and loads[-1]["address"] == "in-process"


def test_a_replica_seeded_before_its_primary_dropped_a_lost_one_learns_the_group():
    # Seeded while the primary still lists the lost backup, the new replica took a
    # group of three; the primary's drop reaches it through the log, and it reads.
    with near(num_workers=1) as c:
        (kv,) = c.ranks
        kv.init("w", np.zeros(3, np.float32))
        primary, backup = c.group.replicas_of[0]
        c.group.kill(0, replica=1)
        seeded = c.group.reseed(0)
        kv.push("w", np.ones(3, np.float32))  # its forward finds the backup lost
        kv.pull("w")
        refreshed = []
        link = kv._links[0]
        link.refresh = lambda f=link.refresh: (refreshed.append(1), f())[1]
        before = _pulls([seeded])[0]
        for _ in range(3):
            kv.push("w", np.ones(3, np.float32))
            np.testing.assert_array_equal(kv.pull("w"), [1.0, 1.0, 1.0])  # the push, assigned
        assert seeded.log.group.listed() == primary.log.group.listed()
        assert len(seeded.log.group.members) == 2
        assert _pulls([seeded])[0] - before >= 3  # near reads on the new replica
        assert len(refreshed) <= 1  # its answers name the primary's epoch


def test_a_failed_round_is_raised_by_the_backup_once_to_each_rank():
    def too_big(key, grad, stored):
        if np.abs(grad).max() > 10:
            raise ValueError(f"gradient of {key} too big")
        stored += grad

    with near() as c:
        r0, r1 = c.ranks
        for kv in c.ranks:
            kv.init("w", np.zeros(2, np.float32))
        r0.set_updater(too_big)
        for kv in c.ranks:
            kv.push("w", np.full(2, 6.0, np.float32))
        primary, backup = c.group.replicas_of[0]
        for kv in c.ranks:
            with pytest.raises(ValueError, match="too big"):
                kv.pull("w")
            np.testing.assert_array_equal(kv.pull("w"), [0.0, 0.0])  # told once
        assert _pulls([primary]) == [0]


@pytest.mark.parametrize("kind", ["dist_sync", "dist_ssp"])
def test_pulls_go_to_the_primary_where_a_backup_cannot_vouch_for_every_replica(kind):
    # with three replicas, the third may lack what the rank's own backup applied
    kw = {"staleness": 1} if kind == "dist_ssp" else {}
    with near(kind, replicas=3, **kw) as c:
        for kv in c.ranks:
            kv.init("w", np.zeros(3, np.float32))
        for kv in c.ranks:
            kv.push("w", np.ones(3, np.float32))
        for kv in c.ranks:
            kv.pull("w")
        primary, *backups = c.group.replicas_of[0]
        assert _pulls([primary]) == [2] and _pulls(backups) == [0] * len(backups)


def test_a_backup_that_cannot_answer_sends_the_rank_to_the_primary(monkeypatch):
    # A backup that cannot answer (as one not seeded yet) answers no value, and the
    # rank asks the primary.
    from labkv.cluster._server.replication import reads

    with near(num_workers=1) as c:
        kv = c.ranks[0]
        kv.init("w", np.zeros(3, np.float32))
        link = kv._links[0]
        primary, backup = c.group.replicas_of[0]
        monkeypatch.setattr(reads, "can_read", lambda server: False)
        backup.log.group.epoch += 5  # as a replica being seeded may have: not the group's
        refreshed = []
        monkeypatch.setattr(link, "refresh", lambda: refreshed.append(1))
        kv.push("w", np.ones(3, np.float32))
        np.testing.assert_array_equal(kv.pull("w"), [1.0, 1.0, 1.0])
        assert _pulls([primary, backup]) == [1, 0]
        assert refreshed == []  # the refusal names no epoch: nothing to learn from it


def _read_where(kv):
    """Ten push+pull rounds of a rank; the values, per server id the pulls its
    replicas on this rank's worker answered (None: none there), and the pushes
    its replicated links still keep."""
    keys = ["w", "big"]
    outs = [np.empty(3, np.float32), np.empty(1000, np.float32)]
    for step in range(10):
        kv.push(keys, [np.full(3, step + kv.rank, np.float32), np.ones(1000, np.float32)])
        kv.pull(keys, out=outs)
    here = []
    for link in kv._links:
        replicas = link.links.values() if isinstance(link, ReplicatedLink) else [link]
        local = [ln for ln in replicas if ln.local is not None]
        here.append(None if not local else (local[0].local.primary, _pulls([local[0].local])[0]))
    kept = [len(link.kept) for link in kv._links if isinstance(link, ReplicatedLink)]
    return [o.copy() for o in outs], here, kept


@pytest.mark.slow
def test_ranks_on_a_local_cluster_read_a_remote_primary_s_keys_on_their_own_worker():
    with _two_workers() as (handle, run):
        results = {}
        for replicas in (1, 2):
            kv = labkv.create("dist_sync", cluster=handle, num_servers=2, replicas=replicas)
            kv.init(["w", "big"], [np.zeros(3, np.float32), np.zeros(1000, np.float32)])
            results[replicas] = run(_read_where, num_workers=2, cluster=handle, kvstore=kv)
            kv.close()
    for (one, _, _), (two, here, kept) in zip(results[1], results[2], strict=True):
        for a, b in zip(one, two, strict=True):
            np.testing.assert_array_equal(a, b)
        # Each worker holds one server's primary and the other's backup: the rank
        # read the backup's server on its backup (10 pulls), its primary's on it.
        assert sorted(here) == [(False, 10), (True, 10)], here
        # the pushes' replies acknowledged what the reads found on both replicas
        assert max(kept) <= 2, kept


def _ssp_steps(kv):
    """Ten push+pull rounds of a dist_ssp rank, a barrier, one more pull; that
    pull's values and, per server id, the pulls its replica on this worker answered."""
    keys = ["w", "big"]
    for step in range(10):
        kv.push(keys, [np.full(3, step + kv.rank, np.float32), np.ones(1000, np.float32)])
        kv.pull(keys)
    kv.barrier()
    values = kv.pull(keys)
    here = []
    for link in kv._links:
        local = [ln for ln in link.links.values() if ln.local is not None]
        here.append((local[0].local.primary, _pulls([local[0].local])[0]))
    return values, here


@pytest.mark.slow
def test_dist_ssp_ranks_on_a_local_cluster_read_on_their_own_worker_within_the_bound():
    with _two_workers() as (handle, run):
        kv = labkv.create("dist_ssp", cluster=handle, num_servers=2, replicas=2, staleness=0)
        kv.init(["w", "big"], [np.zeros(3, np.float32), np.zeros(1000, np.float32)])
        kv.set_optimizer(labkv.optimizers.SGD(learning_rate=1.0))  # w -= each push
        results = run(_ssp_steps, num_workers=2, cluster=handle, kvstore=kv)
        kv.close()
    pushed = sum(np.full(3, step + rank, np.float32) for step in range(10) for rank in (0, 1))
    for values, here in results:
        np.testing.assert_array_equal(values[0], -pushed)
        np.testing.assert_array_equal(values[1], np.full(1000, -20.0, np.float32))
        # each rank read the remote primary's server on its own worker's backup
        assert sorted(here) == [(False, 11), (True, 11)], here


def _push_and_pull(kv):
    for _ in range(10):
        kv.push(["w", "v"], [np.ones(3, np.float32)] * 2)
        kv.pull(["w", "v"])
    kv.barrier()


def _watched(handle, run, kind, replicas):
    """A watched run of two ranks: the events the notebook's store heard (as the
    monitor folds them) once every server flushed."""
    from labkv.widgets._model.monitor_model import MonitorModel

    kw = {"staleness": 0} if kind == "dist_ssp" else {}
    kv = labkv.create(kind, cluster=handle, num_servers=2, replicas=replicas, **kw)
    kv.init(["w", "v"], [np.zeros(3, np.float32)] * 2)
    kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.1))  # every replica applies it
    heard = []
    kv.events.subscribe(heard.append)
    run(_push_and_pull, num_workers=2, cluster=handle, kvstore=kv)
    last, deadline = -1, time.monotonic() + 10
    while time.monotonic() < deadline and not (len(heard) == last and _loads(heard) == {0, 1}):
        last = len(heard)
        time.sleep(0.5)  # until no more events come (the servers flush every 100 ms)
    kv.close()
    model = MonitorModel()
    for e in list(heard):
        model.on_event(e)
    model.flush()
    return model


def _loads(heard):
    return {e.server for e in heard if e.op == "load"}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dist_sync", "dist_ssp"])
def test_a_watched_run_shows_the_near_reads_as_the_primary_s_reads(kind):
    # A backup streams the events of the reads it answers (a dist_ssp pull's clocks)
    # and its counters, which the monitor adds to its server's, and no others (its
    # optimizer steps are its primary's): the monitor shows what it shows with one replica.
    with _two_workers() as (handle, run):
        one, two = (_watched(handle, run, kind, r) for r in (1, 2))
    assert one.counts["clock"] == two.counts["clock"] == (40 if kind == "dist_ssp" else 0)
    # 10 steps of 2 keys: an update a round, or one a push of each of the two ranks
    assert one.counts["optimizer"] == (20 if kind == "dist_sync" else 40)
    # (a server sends a key's round as it is at each flush: how many, the timing says)
    for op in ("push", "pull", "optimizer"):
        assert one.counts[op] == two.counts[op], op
    for s in (0, 1):
        assert one.servers[s].bytes_out == two.servers[s].bytes_out == 240
        assert one.servers[s].bytes_in == two.servers[s].bytes_in
    assert len(two.servers[0].replicas) == 2


def _refused_beside_a_near_read(kv):
    """Fence this rank on the primary of the server whose backup shares its
    worker (not on that backup), then push and pull there: the error, and how
    long the pull took to raise it."""
    from labkv.cluster import ClusterError

    kv.push(["a", "b"], [np.ones(3, np.float32)] * 2)
    kv.pull(["a", "b"])  # one of them a near read; the streams to the primaries are open
    (link,) = [ln for ln in kv._links if ln.links[ln.members[1]].local is not None]
    (key,) = [k for k, p in kv.placement().items() if p[0]["server"] == link.sid]
    link.primary.call("fence", kv._calls.sender, kv.rank, 0.0).result(10)
    kv.push(key, np.ones(3, np.float32))  # held, then sent to the primary beside the read
    start = time.monotonic()
    try:
        kv.pull(key)
    except ClusterError as exc:
        return str(exc), time.monotonic() - start
    return None, time.monotonic() - start


@pytest.mark.slow
def test_a_push_the_primary_refuses_beside_a_near_read_is_raised_at_once():
    with _two_workers() as (handle, run):
        kv = labkv.create("dist_sync", cluster=handle, num_servers=2, replicas=2, timeout=20)
        kv.init(["a", "b"], [np.zeros(3, np.float32), np.zeros(3, np.float32)])
        assert {p[0]["server"] for p in kv.placement().values()} == {0, 1}
        (error, took) = run(_refused_beside_a_near_read, num_workers=1, cluster=handle, kvstore=kv)[
            0
        ]
        kv.close()
    assert error is not None and "refuses rank 0" in error, error
    assert took < 20  # the primary's refusal, not the read's 20 s wait for the round


@pytest.mark.parametrize("servers", [1, 2])
def test_row_sparse_pulls_read_on_the_backup_give_the_local_stores_rows(servers):
    from tests.test_cluster_sparse import PROGRAMS, _dist_run, _local_run, _same

    for program in PROGRAMS:
        want = _local_run(program, 2, sync=True)
        with near(num_servers=servers, timeout=10.0) as c:
            got = _dist_run(c, program, sync=True)
            backups = [c.group.replicas_of[s][1] for s in range(servers)]
            read_on_backups = sum(_pulls(backups))
        for pulled in got:
            _same(pulled, want, exact=False)
        assert read_on_backups > 0
