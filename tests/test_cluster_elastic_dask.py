"""A rank's worker SIGKILLed mid-run on a real LocalCluster, and
``run(..., on_rank_loss="replace")`` carries on: the replacement resumes at the
step its rank was lost in, and the run ends bit-identical to an undisturbed one
(values, optimizer states, update counts). Kills come from inside the rank (at
a chosen step and point, what it held back sent or not) and from this process
(at a random moment: inside a pull, a push or the barrier); with a spare
worker, and without (the replacement waits for the nanny's restart)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
import warnings

import numpy as np
import pytest

import labkv
from labkv.cluster import ClusterError, connect, run
from labkv.cluster._runtime.watch import _result_of
from tests._waiting import wait_until

pytestmark = pytest.mark.slow  # real LocalClusters whose workers are killed

KEYS = ["w", "b", "big"]  # "big" is sliced over both servers
SIZES = {"w": 6, "b": 3, "big": 1500}
STEPS = 40


def _cluster(n):
    return connect(n_workers=n, dashboard_address=None, memory_limit="1GiB", set_as_default=False)


@pytest.fixture
def spare():
    """3 workers for 2 ranks: one spare. Each test its own cluster: the nannies
    of one whose workers were killed may still be restarting them."""
    handle = _cluster(3)
    yield handle
    handle.close()


def _zeros():
    return [np.zeros(SIZES[k], np.float32) for k in KEYS]


def train(kv, kills=(), marker=None, pause=0.0, looping=None, before=None):
    """SGD with momentum on the servers; each ``(rank, incarnation, step, i,
    flush)`` of ``kills`` SIGKILLs that incarnation of the rank before its i-th
    push of the step (after sending what it held back, with ``flush``), first
    writing the time to ``marker``; ``looping``: a file made when the step loop
    starts; ``before``: ``(rank, point)``, that rank's first incarnation killed
    before its ``"init"``, ``"optimizer"``, ``"barrier"`` or ``"final"`` pull
    (after sending what it held), or just after it ``"returned"`` (before its
    result may have reached the scheduler). The final values, the states, the
    incarnation, and when this incarnation pushed first."""

    def killed_before(point):
        if before == (kv.rank, point) and kv.incarnation == 0:
            kv.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    killed_before("init")
    kv.init(KEYS, _zeros())
    killed_before("optimizer")
    kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.05, momentum=0.9, wd=0.01))
    killed_before("barrier")
    kv.barrier()
    first_push = None
    for step in kv.steps(STEPS):
        if looping and step.index == 0:
            open(looping, "w").close()
        outs = _zeros()
        kv.pull(KEYS, out=outs)
        coupling = np.float32(sum(float(o.sum()) for o in outs) * 1e-3)
        for i, key in enumerate(KEYS):
            for rank, incarnation, at, point, flush in kills:
                if (kv.rank, kv.incarnation, step.number, i) == (rank, incarnation, at, point):
                    if flush:
                        kv.flush()
                    if marker:
                        with open(f"{marker}-{kv.rank}", "w") as f:
                            f.write(repr(time.time()))
                    os.kill(os.getpid(), signal.SIGKILL)
            noise = step.rng.standard_normal(SIZES[key]).astype(np.float32)
            kv.push(key, 0.1 * outs[i] + coupling + noise * (kv.rank + 1 + i))
            first_push = first_push or time.time()
        time.sleep(pause)
    killed_before("final")
    outs = _zeros()
    kv.pull(KEYS, out=outs)
    if before == (kv.rank, "returned") and kv.incarnation == 0:
        threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGKILL)).start()
    return [o.tobytes() for o in outs], kv._optimizer_states(), kv.incarnation, first_push


def _run(handle, workers=3, num_servers=2, fn=train, **kw):
    """``fn`` run by 2 ranks; a replay that pushed other bits (a warning) fails it."""
    handle.client.wait_for_workers(workers, timeout=60)
    kw.setdefault("on_rank_loss", "replace")
    kw.setdefault("replicas", 2)
    opts = dict(num_workers=2, cluster=handle, bigarray_bound=1000)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "the replacement of rank", RuntimeWarning)
        return run(fn, timeout=30, num_servers=num_servers, **opts, **kw)


def _same(got, want):
    for rank in (0, 1):
        assert got[rank][0] == want[rank][0], f"rank {rank}'s values differ"
    num_update, counts, states = got[0][1]
    assert (num_update, counts) == want[0][1][:2]
    for key in KEYS:
        assert [a.tobytes() for a in states[key]] == [a.tobytes() for a in want[0][1][2][key]]


@pytest.fixture(scope="module")
def reference():
    """The undisturbed run (bit-identical on any cluster: the sums and the
    optimizer run on the servers in a fixed order)."""
    handle = _cluster(3)
    try:
        return _run(handle, on_rank_loss="fail")
    finally:
        handle.close()


def test_a_rank_killed_at_random_steps_and_points_ends_bit_identical(spare, reference, tmp_path):
    rng = random.Random(7)
    delays = []
    for seed in range(10):
        rank, at, point = rng.randint(0, 1), rng.randint(1, STEPS - 2), rng.randint(0, 2)
        flush = rng.random() < 0.5
        marker = str(tmp_path / f"killed-{seed}")
        got = _run(spare, kwargs={"kills": [(rank, 0, at, point, flush)], "marker": marker})
        _same(got, reference)
        assert got[rank][2] == 1 and got[1 - rank][2] == 0  # one replacement, of that rank
        with open(f"{marker}-{rank}") as f:
            delays.append(got[rank][3] - float(f.read()))
    print(f"kill -> the replacement's first push: {sorted(round(d, 3) for d in delays)} s")
    assert max(delays) < 30


_BEFORE = ["init", "optimizer", "barrier", "final"]


@pytest.mark.parametrize(("rank", "point"), [(r, p) for r in (0, 1) for p in _BEFORE])
def test_a_rank_killed_before_its_init_optimizer_barrier_or_final_pull_ends_bit_identical(
    spare, reference, rank, point
):
    """A barrier is broadcast to every replica: one to a backup on the dead
    worker must not wait out Dask's connect retries, and a replica seeded after
    some ranks entered it learns that it passed. init and the optimizer go
    through the primary's log: a replica seeded while the other rank's are in
    flight gets them too. Killed before the final pull, a rank's replacement
    resumes after the last step."""
    got = _run(spare, kwargs={"before": (rank, point)}, replace_timeout=5.0)
    _same(got, reference)
    assert got[rank][2] == 1


def test_a_rank_killed_just_after_its_function_returned_ends_bit_identical(spare, reference):
    """Its result may be lost with its worker before it is gathered: the
    replacement then runs the function again, every step already done."""
    got = _run(spare, kwargs={"before": (1, "returned")}, replace_timeout=5.0)
    _same(got, reference)
    assert got[1][2] in (0, 1)  # gathered in time, or replaced


def test_a_finished_rank_whose_worker_died_before_its_result_was_gathered_is_lost(spare):
    """The result lived on the dead worker and the task, pinned to it, is never
    computed again: the watcher's look at it ends (``Future.result()`` alone
    would wait forever) and the rank counts as lost; a live worker's result is
    gathered."""
    client = spare.client
    doomed, kept = spare.workers()[:2]
    futures = {
        w: client.submit(os.getpid, workers=[w], allow_other_workers=False, pure=False)
        for w in (doomed, kept)
    }
    wait_until(lambda: all(f.status == "finished" for f in futures.values()), timeout=30)
    pids = client.run(os.getpid, workers=[doomed, kept])
    os.kill(pids[doomed], signal.SIGKILL)
    wait_until(lambda: futures[doomed].status == "lost", timeout=30)
    began = time.monotonic()
    assert _result_of(futures[doomed], lambda: doomed in spare.workers()) == (False, None)
    assert time.monotonic() - began < 5
    assert _result_of(futures[kept], lambda: kept in spare.workers()) == (True, pids[kept])


def differing(kv, marker):
    """Rank 1 pushes "w" of step 2 and is killed before "b", while rank 0 waits
    until the replacement has replayed the step (``marker``): the round of "w"
    still waits, and the replay pushes other bits (they depend on the incarnation)."""
    kv.init(["w", "b"], [np.zeros(4, np.float32)] * 2)
    seen = []
    for step in kv.steps(4):
        if (kv.rank, step.index) == (0, 2):
            wait_until(lambda: os.path.exists(marker), timeout=30)
        kv.push("w", np.full(4, 1.0 + kv.incarnation, np.float32))
        if (kv.rank, step.index, kv.incarnation) == (1, 2, 0):
            kv.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        kv.push("b", np.ones(4, np.float32))
        if (kv.rank, step.index, kv.incarnation) == (1, 2, 1):
            kv.flush()
            open(marker, "w").close()
        seen.append(float(kv.pull("w")[0]))
    return seen


def test_a_replay_that_pushed_other_bits_is_reported_by_run(spare, tmp_path):
    """The servers keep the first push and count the mismatch; run warns, naming
    the rank, once every rank is done."""
    with pytest.warns(RuntimeWarning, match=r"rank\(s\) \[1\] pushed other bits .* 1 replayed"):
        got = run(
            differing,
            num_workers=2,
            cluster=spare,
            num_servers=1,
            replicas=2,
            on_rank_loss="replace",
            timeout=30,
            kwargs={"marker": str(tmp_path / "replayed")},
        )
    # Each round's sum is the value (no updater), and a pull after the step's push
    # of "w" reads that push's round: round 2 kept rank 1's first push (1.0), not
    # its replay's (2.0: the sum would be 3); round 3 has the replacement's 2.0.
    assert got[0] == [2.0, 2.0, 2.0, 3.0]


def test_the_replacement_killed_again_is_replaced_again(reference):
    """Rank 1 is killed at step 3 and its replacement at step 9, with the
    primary of server 1 both times: with two spares every server keeps a
    replica (the ranks learn of the re-seeded one at their next reply)."""
    handle = _cluster(4)
    try:
        kills = [(1, 0, 3, 1, True), (1, 1, 9, 2, True)]
        got = _run(handle, workers=4, kwargs={"kills": kills, "pause": 0.05})
        _same(got, reference)
        assert got[1][2] == 2
    finally:
        handle.close()


def test_a_rank_s_worker_killed_from_outside_at_a_random_moment_ends_bit_identical(
    spare, reference, tmp_path
):
    """Killed wherever it is in its step loop: in a pull, a push, or between steps."""
    rng = random.Random(11)
    for attempt in range(3):
        spare.client.wait_for_workers(3, timeout=60)
        rank_worker = sorted(spare.workers())[1]  # rank 1's (ranks take the first workers)
        pid = spare.client.run(os.getpid, workers=[rank_worker])[rank_worker]
        looping, delay = tmp_path / f"looping-{attempt}", rng.uniform(0.05, 0.8)

        def kill_in_the_loop(delay=delay, looping=looping, pid=pid):
            if wait_until(looping.exists, timeout=60):
                time.sleep(delay)
                os.kill(pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_in_the_loop)
        killer.start()
        got = _run(spare, kwargs={"pause": 0.08, "looping": str(looping)})
        killer.join()
        _same(got, reference)
        assert got[1][2] == 1


async def _declare_lost(address, dask_scheduler=None):
    await dask_scheduler.remove_worker(address, stimulus_id="declared-lost", close=True)


def test_a_frozen_rank_declared_lost_and_woken_after_its_replacement_changes_nothing(
    spare, reference
):
    """SIGSTOP rank 1's worker (it also holds server 1's primary), have the
    scheduler drop it, SIGCONT it once the replacement runs: whatever the
    woken incarnation still sends is refused, and the run ends bit-identical."""
    spare.client.wait_for_workers(3, timeout=60)
    rank_worker = sorted(spare.workers())[1]
    pid = spare.client.run(os.getpid, workers=[rank_worker])[rank_worker]

    def rank_running():
        tasks = spare.client.processing(workers=[rank_worker]).get(rank_worker, ())
        return any(str(k).startswith("labkv-rank-") for k in tasks)

    def freeze_then_wake():
        assert wait_until(rank_running, timeout=60)
        time.sleep(0.4)  # into its steps
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.3)
        spare.client.run_on_scheduler(_declare_lost, rank_worker)
        time.sleep(1.5)
        os.kill(pid, signal.SIGCONT)

    zombie = threading.Thread(target=freeze_then_wake)
    zombie.start()
    try:
        got = _run(spare, kwargs={"pause": 0.08})
    finally:
        zombie.join()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    _same(got, reference)
    assert got[1][2] == 1


def test_the_replacement_killed_during_its_replay_is_replaced_again(reference):
    """Rank 1 is killed at step 5 before its second push, and its replacement
    while it replays step 5, after its first push there (already applied: a
    replay skipped): the third incarnation replays the step once more. The
    second loss comes a fraction of a second after the first, before a server
    that lost a replica has a new one: ``replicas=3`` keeps one of each."""
    handle = _cluster(4)
    try:
        kills = [(1, 0, 5, 1, True), (1, 1, 5, 2, True)]
        got = _run(handle, workers=4, replicas=3, kwargs={"kills": kills})
        _same(got, reference)
        assert got[1][2] == 2
    finally:
        handle.close()


def test_a_step_that_kills_every_replacement_fails_the_run_naming_it(spare):
    """One server, on ranks 0's and 1's workers: rank 1's losses cost a backup only."""
    kills = [(1, i, 4, 1, True) for i in range(3)]
    with pytest.raises(ClusterError, match=r"rank 1 was lost 3 times at step 4 .*is a crash"):
        _run(spare, num_servers=1, kwargs={"kills": kills})


def test_max_restarts_caps_the_replacements(spare):
    kills = [(1, 0, 3, 0, True), (1, 1, 6, 0, True)]
    with pytest.raises(ClusterError, match=r"rank 1 was lost 2 times .*max_restarts=1"):
        _run(spare, num_servers=1, kwargs={"kills": kills}, max_restarts=1)


def test_without_a_spare_the_replacement_waits_for_the_restarted_worker(reference):
    handle = _cluster(2)
    try:
        before = set(handle.workers())
        opts = dict(num_workers=2, cluster=handle, num_servers=2, replicas=2, bigarray_bound=1000)
        got = run(
            train,
            timeout=30,
            on_rank_loss="replace",
            kwargs={"kills": [(1, 0, 6, 1, True)]},
            **opts,
        )
        _same(got, reference)
        assert set(handle.workers()) != before  # rank 1 runs on the nanny's new worker
    finally:
        handle.close()


def test_bad_loss_settings_are_refused_before_anything_starts(spare):
    with pytest.raises(ValueError, match="on_rank_loss must be one of"):
        run(train, num_workers=2, cluster=spare, on_rank_loss="retry")
    with pytest.raises(ValueError, match="max_restarts"):
        run(train, num_workers=2, cluster=spare, on_rank_loss="replace", max_restarts=-1)


def _counting(key, grad, weight):
    """Every push applied adds its values (so a count of pushes shows)."""
    weight += grad


def shrinking(kv, lost_at):
    """Each step pushes ones, pulls and meets the others at a barrier; rank 1
    SIGKILLs its worker at step ``lost_at`` (after sending what it held). The
    final values."""
    kv.init(KEYS, _zeros())
    kv.set_updater(_counting)
    kv.barrier()
    for step in kv.steps(STEPS):
        if kv.rank == 1 and step.number == lost_at:
            kv.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        kv.push(KEYS, [np.ones(SIZES[k], np.float32) for k in KEYS])
        kv.pull(KEYS)
        kv.barrier()
    kv.flush()
    return kv.pull(KEYS)


@pytest.mark.parametrize("kind", ["dist_async", "dist_ssp"])
def test_shrink_goes_on_without_a_killed_rank_and_counts_its_pushes_before_once(spare, kind):
    """dist_async (``big`` sliced, a custom updater) and dist_ssp (staleness 0,
    with replicas no custom updater on a sliced key: nothing sliced): rank 1's
    worker, which also hosts servers, is SIGKILLed at step 5; rank 0's barriers
    and pulls go on without it, and every push rank 1 made before counts once."""
    spare.client.wait_for_workers(3, timeout=60)
    ssp = kind == "dist_ssp"
    got = run(
        shrinking,
        num_workers=2,
        cluster=spare,
        kvstore=kind,
        staleness=0 if ssp else None,
        replicas=2,
        bigarray_bound=10**6 if ssp else 1000,
        timeout=30,
        on_rank_loss="shrink",
        kwargs={"lost_at": 5},
    )
    assert got[1] is None
    for key, value in zip(KEYS, got[0], strict=True):
        assert np.all(value == STEPS + 5), key


def test_shrink_with_every_rank_lost_fails_the_run(spare):
    """Rank 1 dies first; rank 0 once the servers it shared a worker with have
    new replicas on the spare, so that only the ranks are lost."""

    def both_die(kv):
        kv.init(KEYS, _zeros())
        kv.barrier()
        if kv.rank == 0:
            time.sleep(4.0)
        os.kill(os.getpid(), signal.SIGKILL)

    spare.client.wait_for_workers(3, timeout=60)
    with pytest.raises(ClusterError, match="every rank was lost"):
        run(
            both_die,
            num_workers=2,
            cluster=spare,
            kvstore="dist_async",
            replicas=2,
            timeout=30,
            on_rank_loss="shrink",
        )


def clocked(kv, kill_at, staleness):
    """Rank r pushes a one at position r of "c" each step and pulls it: the
    count at position j is rank j's pushes applied. Rank 1's first incarnation
    SIGKILLs its worker at step ``kill_at`` (after sending what it held). The
    final counts, and every pull (with ``staleness``) that saw a rank more
    than the bound behind."""
    kv.init("c", np.zeros(2, np.float32))
    kv.set_updater(_counting)
    kv.barrier()
    late = []
    for step in kv.steps(STEPS):
        if (kv.rank, kv.incarnation, step.number) == (1, 0, kill_at):
            kv.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        one = np.zeros(2, np.float32)
        one[kv.rank] = 1.0
        kv.push("c", one)
        seen = kv.pull("c")
        if staleness is not None and seen.min() < step.number + 1 - staleness:
            late.append((step.number, seen.tolist()))
    kv.barrier()
    return kv.pull("c"), late


@pytest.mark.parametrize("kind", ["dist_async", "dist_ssp"])
def test_async_and_ssp_count_each_push_once_and_keep_the_bound_through_a_replacement(spare, kind):
    """A real replacement (SIGKILL at step 7): every (rank, step) push counted
    exactly once, and in dist_ssp (staleness 1) no pull of the live rank ever
    saw the replaced rank more than the bound behind while it was replaced."""
    spare.client.wait_for_workers(3, timeout=60)
    staleness = 1 if kind == "dist_ssp" else None
    got = run(
        clocked,
        num_workers=2,
        cluster=spare,
        kvstore=kind,
        staleness=staleness,
        replicas=2,
        timeout=30,
        on_rank_loss="replace",
        kwargs={"kill_at": 7, "staleness": staleness},
    )
    for counts, late in got:
        np.testing.assert_array_equal(counts, [STEPS, STEPS])
        assert late == []


def pushing(kv, marker):
    """Ones pushed to "w" step after step; rank 1's first incarnation writes
    ``marker`` and SIGKILLs its worker at step 4."""
    for step in kv.steps(200):
        if (kv.rank, kv.incarnation, step.number) == (1, 0, 4):
            kv.flush()
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        kv.push("w", np.ones(4, np.float32))
        kv.pull("w")
        time.sleep(0.02)


@pytest.mark.usefixtures("python_s_own_sigint_handler")
def test_ctrl_c_while_a_rank_is_replaced_stops_every_incarnation(tmp_path):
    """No spare: the replacement waits for the nanny's restart when Ctrl-C
    comes. ``run`` raises KeyboardInterrupt at once, nothing writes to the shared
    store after it (neither the live rank nor a replacement started before
    the interrupt), and the next run on the store works at once."""
    handle = _cluster(2)
    kv = labkv.create("dist_async", cluster=handle, num_servers=2, replicas=2, timeout=20)
    try:
        kv.init("w", np.zeros(4, np.float32))
        kv.set_updater(_counting)
        marker, sent = tmp_path / "lost", []

        def interrupt():
            # The bound only stops a hang: on a busy machine the ranks start slowly.
            if not wait_until(marker.exists, timeout=180):
                return  # no SIGINT: the run ends, and the test fails naming the marker
            time.sleep(0.3)  # the watcher is replacing the rank
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

        killer = threading.Thread(target=interrupt)
        killer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                run(
                    pushing,
                    num_workers=2,
                    kvstore=kv,
                    on_rank_loss="replace",
                    kwargs={"marker": str(marker)},
                )
        finally:
            killer.join()
            assert marker.exists(), "rank 1 never reached step 4 (no kill, no Ctrl-C)"
        assert time.monotonic() - sent[0] < 20  # not after the store's 20 s timeout
        stopped = kv.peek("w")
        assert stopped[0] > 0
        time.sleep(1.5)
        np.testing.assert_array_equal(kv.peek("w"), stopped)  # nothing writes after
        handle.client.wait_for_workers(2, timeout=60)
        start = time.monotonic()
        for value in run(_push_once_more, num_workers=2, kvstore=kv):
            np.testing.assert_array_equal(value, stopped + 2)
        assert time.monotonic() - start < 20  # not after the store's 20 s timeout
    finally:
        kv.close()
        handle.close()


def _push_once_more(kv):
    kv.push("w", np.ones(4, np.float32))
    kv.barrier()
    return kv.pull("w")
