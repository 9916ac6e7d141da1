"""A rank lost mid-run and replaced, without Dask: real ``Server``s in this
process (with and without replicas), real ``DistStore`` ranks in threads. A
rank "dies" at a chosen point of a step (its thread stops there, what it sent
stays sent), its incarnation is fenced as ``run``'s watcher fences it, and a
replacement (the next incarnation) runs the same function: the run must end
bit-identical to an undisturbed one, values, optimizer states and update
counts, and replayed pushes must be skipped, audited and counted once."""

from __future__ import annotations

import contextlib
import re
import threading
import time

import numpy as np
import pytest

import labkv
from labkv.cluster._errors import ClusterError
from labkv.cluster._transport.base import GRACE_S
from tests._inprocess import InProcessCluster
from tests._replacing import Died, replacement, run_through_a_death
from tests._waiting import in_threads

KEYS = ["w", "b", "big"]  # "big" is sliced over both servers (bigarray_bound=1000)
SIZES = {"w": 6, "b": 3, "big": 1500}
STEPS = 8


def _zeros():
    return [np.zeros(SIZES[k], np.float32) for k in KEYS]


def _grad(kv, step, i, outs):
    """Depends on every value pulled in this step and on the step's rng: a replay
    that read another value of any key, or drew other numbers, pushes other bits."""
    value = outs[i]
    noise = step.rng.standard_normal(value.shape).astype(np.float32)
    coupling = np.float32(sum(float(o.sum()) for o in outs) * 1e-3)
    return (0.1 * value + coupling + noise * (kv.rank + 1 + i)).astype(np.float32)


def train(kv, die=None, barriers=False, nondeterministic=False):
    """SGD with momentum on the servers, one push per key per step; ``die(kv,
    step, point)`` may end the rank (``point``: ``("before", i)`` before the
    i-th key's push, ``"pulled"``, ``"after"``)."""
    if die:
        die(kv, -1, "init")
    kv.init(KEYS, _zeros())
    if die:
        die(kv, -1, "optimizer")
    kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.05, momentum=0.9, wd=0.01))
    kv.barrier()
    for step in kv.steps(STEPS):
        outs = _zeros()
        kv.pull(KEYS, out=outs)
        if die:
            die(kv, step.number, "pulled")
        for i, key in enumerate(KEYS):
            if die:
                die(kv, step.number, ("before", i))
            grad = _grad(kv, step, i, outs)
            if nondeterministic and kv.incarnation:
                grad = grad + 1.0
            kv.push(key, grad)
        if barriers:
            kv.barrier()
        if die:
            die(kv, step.number, "after")
    outs = _zeros()
    kv.pull(KEYS, out=outs)
    return outs


def _cluster(replicas, kind="dist_sync"):
    return InProcessCluster(kind, 2, 2, timeout=5.0, replicas=replicas, bigarray_bound=1000)


def _states(kv):
    num_update, counts, states = kv._optimizer_states()
    return num_update, counts, {k: [np.asarray(a).tobytes() for a in v] for k, v in states.items()}


def _undisturbed(replicas, **kw):
    with _cluster(replicas) as c:
        outs = in_threads(*[lambda kv=kv: train(kv, **kw) for kv in c.ranks])
        return outs, _states(c.ranks[0])


def _disturbed(replicas, lost, at, point, flushed=True, **kw):
    """Rank ``lost`` dies at step ``at``, ``point``, after what it holds back was
    sent (``flushed``) or with it (small pushes wait to ride on the next call:
    they are lost with the rank); its replacement runs on."""
    with _cluster(replicas) as c:
        outs, again = run_through_a_death(c, train, lost, at, point, flushed, **kw)
        live = c.ranks[1 - lost]
        return outs, _states(live), live.server_load(), c, again


POINTS = ["pulled", ("before", 0), ("before", 1), ("before", 2), "after"]


@pytest.mark.parametrize("flushed", [True, False], ids=["sent", "held"])
@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("lost", [0, 1])
@pytest.mark.parametrize("point", POINTS, ids=str)
def test_a_replaced_rank_ends_the_run_bit_identical_to_an_undisturbed_one(
    replicas, lost, point, flushed
):
    reference, states = _undisturbed(replicas)
    outs, got_states, loads, _, _ = _disturbed(replicas, lost, 3, point, flushed)
    for rank in (0, 1):
        for key, want, got in zip(KEYS, reference[rank], outs[rank], strict=True):
            assert want.tobytes() == got.tobytes(), (rank, key)
    assert got_states == states  # update counts and every momentum, bit for bit
    if flushed and point in (("before", 1), ("before", 2)):  # step 3 is replayed
        assert sum(load["replayed"] for load in loads) >= 1
    assert sum(load["replay_mismatches"] for load in loads) == 0


@pytest.mark.parametrize("point", ["init", "optimizer"])
@pytest.mark.parametrize("lost", [0, 1])
def test_a_rank_lost_before_its_init_or_optimizer_is_replaced_and_the_owner_s_duties_inherited(
    lost, point
):
    """Rank 0 owns init: its replacement initialises what it had not (and keeps
    what it had), and its equal optimizer keeps the states already there."""
    reference, states = _undisturbed(2)
    outs, got_states, *_ = _disturbed(2, lost, -1, point)
    assert [a.tobytes() for a in outs[0]] == [a.tobytes() for a in reference[0]]
    assert got_states == states


def test_barriers_inside_the_steps_line_up_for_a_replacement():
    reference, states = _undisturbed(1, barriers=True)
    outs, got_states, *_ = _disturbed(1, lost=1, at=5, point=("before", 1), barriers=True)
    assert [a.tobytes() for a in outs[1]] == [a.tobytes() for a in reference[1]]
    assert got_states == states


def test_a_replay_that_pushes_other_bits_is_counted_as_a_mismatch_and_the_first_push_kept():
    reference, states = _undisturbed(1)
    # rank 1 dies after pushing w and b of step 2; its replacement pushes other
    # bits for them: the first pushes were applied or wait in their round, so the
    # replay changes nothing, and the mismatches are counted where they are seen.
    outs, got_states, loads, *_ = _disturbed(
        1, lost=1, at=2, point=("before", 2), nondeterministic=True
    )
    assert (
        sum(load["replay_mismatches"] for load in loads) + sum(load["replayed"] for load in loads)
        >= 2
    )
    # the replacement's later steps push other bits too: the run differs after
    assert outs[0][0].tobytes() != reference[0][0].tobytes()


def test_the_lost_incarnation_is_refused_once_fenced_and_the_replacement_is_not():
    with _cluster(1) as c:
        old = c.ranks[1]
        for kv in c.ranks:
            kv.init(KEYS, _zeros()) if kv.rank == 0 else None
        c.ranks[1].init(KEYS, _zeros())
        again = replacement(c, 1)
        with pytest.raises(ClusterError, match="replaced after it was taken for lost"):
            old.push("w", np.ones(SIZES["w"], np.float32))
            old.flush()
        again.push("w", np.ones(SIZES["w"], np.float32))  # the new incarnation is not fenced
        again.flush()


@pytest.mark.parametrize("kind", ["dist_async", "dist_ssp"])
def test_async_and_ssp_apply_each_rank_step_key_push_once_through_a_replacement(kind):
    def counting(key, grad, weight):  # every push applied adds its ones
        weight += grad

    kw = {"staleness": 1} if kind == "dist_ssp" else {}
    with InProcessCluster(kind, 2, 2, timeout=5.0, bigarray_bound=1000, **kw) as c:

        def loop(kv, die_at=None):
            kv.init(KEYS, _zeros())
            kv.set_updater(counting)
            for step in kv.steps(STEPS):
                for i, key in enumerate(KEYS):
                    if (kv.rank, kv.incarnation, step.number, i) == (1, 0, die_at, 2):
                        kv.flush()  # what it sent arrives; then it is gone
                        raise Died
                    kv.push(key, np.ones(SIZES[key], np.float32))
            kv.flush()

        def first_rank1():
            with contextlib.suppress(Died):
                loop(c.ranks[1], die_at=4)

        threads = [
            threading.Thread(target=first_rank1, daemon=True),
            threading.Thread(target=loop, args=(c.ranks[0],), daemon=True),
        ]
        for t in threads:
            t.start()
        threads[0].join(10)
        again = replacement(c, 1)
        in_threads(lambda: loop(again), timeout=30)
        threads[1].join(30)
        loads = c.ranks[0].server_load()
        values = c.ranks[0].pull(KEYS)
    # every (rank, step, key) push applied once: 2 ranks x STEPS pushes of ones
    for key, value in zip(KEYS, values, strict=True):
        assert np.all(value == 2 * STEPS), key
    assert sum(load["replayed"] for load in loads) == 2  # step 4's w and b, on their servers


def test_pushes_outside_and_between_step_loops_all_count():
    """A second loop numbers its steps on from the first; pushes outside any loop
    carry no step, so none of them is taken for a replay."""
    with _cluster(1) as c:

        def loops(kv):
            kv.init("n", np.zeros(2, np.float32))
            kv.set_optimizer(labkv.optimizers.SGD(learning_rate=-1.0))  # w += grad
            numbers = []
            for step in kv.steps(3):
                kv.push("n", np.ones(2, np.float32))
                numbers.append(step.number)
            for _ in range(2):  # outside any loop, after one
                kv.push("n", np.ones(2, np.float32))
            for step in kv.steps(2):
                kv.push("n", np.ones(2, np.float32))
                numbers.append((step.index, step.number))
            return numbers, kv.pull("n")

        (numbers, value), _ = in_threads(*[lambda kv=kv: loops(kv) for kv in c.ranks])
    assert numbers == [0, 1, 2, (0, 3), (1, 4)]
    assert np.all(value == 2 * 7)  # 7 pushes of ones by each of 2 ranks


@pytest.mark.slow  # 6.5 s each: past a rank's own deadline
@pytest.mark.parametrize("hold", [0.0, 10.0], ids=["not held", "held"])
def test_the_live_rank_waits_past_its_timeout_while_the_lost_one_is_replaced(hold):
    """timeout=0.5 s; rank 1 is lost before its push of step 2 and fenced at
    once (the servers hold their waits 10 s), but its replacement starts only
    after the live rank's own deadline (timeout + grace) has passed. With the
    run's hold (``replace_hold``) the live rank waits on and both finish; without
    it the live rank gives up, naming the server it waited for."""
    with InProcessCluster("dist_sync", 2, 2, timeout=0.5, replace_hold=hold) as c:
        died, results = threading.Event(), {}

        def loop(kv):
            kv.init(KEYS, _zeros())
            for step in kv.steps(4):
                if (kv.rank, kv.incarnation, step.number) == (1, 0, 2):
                    kv.flush()
                    died.set()
                    raise Died
                kv.push(KEYS, _zeros())
                kv.pull(KEYS)
            results[kv.rank] = step.number

        def live():
            try:
                loop(c.ranks[0])
            except Exception as exc:
                results["error"] = exc

        def first():
            with contextlib.suppress(Died):
                loop(c.ranks[1])

        threads = [threading.Thread(target=f, daemon=True) for f in (live, first)]
        for t in threads:
            t.start()
        assert died.wait(10)
        again = replacement(c, 1)  # fences at once: the servers hold 10 s
        time.sleep(0.5 + GRACE_S + 0.5)  # past the live rank's own deadline
        if hold:
            in_threads(lambda: loop(again), timeout=30)
            threads[0].join(10)
            assert results == {0: 3, 1: 3}
        else:
            threads[0].join(10)
            assert re.search(r"did not answer (a push|pull) within 5.5 s", str(results["error"]))


def test_runs_docstring_and_the_docs_give_the_same_loss_limit():
    """``Replacer.replace`` fails a rank's third loss at one step (tested in
    test_cluster_elastic_dask.py); ``run``'s docstring and docs/cluster.md say so."""
    from pathlib import Path

    from labkv.cluster import run

    docs = (Path(__file__).resolve().parents[1] / "docs" / "cluster.md").read_text()
    for text in (run.__doc__, docs):
        said = " ".join(text.split())
        assert "lost three times at the same step (itself, then its replacement twice)" in said
        assert "lost twice at the same step" not in said
