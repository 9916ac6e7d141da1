"""dist_ssp (bounded staleness) with 2 ranks on a real 2-process LocalCluster."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import labkv
from labkv.cluster import ClusterError, run

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

STEPS = 5


def _add(key, merged, stored):
    stored += merged


def _bit(rank: int, clock: int) -> float:
    """The value rank ``rank`` pushes at its ``clock``-th push (1-based): one bit
    each, so a pulled sum says exactly which pushes it holds."""
    return float(2 ** (rank * STEPS + clock - 1))


def _held(value: float, workers: int) -> dict[int, set[int]]:
    """rank -> clocks of its pushes that ``value`` holds."""
    bits = int(value)
    return {
        r: {c for c in range(1, STEPS + 1) if bits >> (r * STEPS + c - 1) & 1}
        for r in range(workers)
    }


def _program(kv, sleeps):
    """STEPS x (sleep, push, sleep, pull) of a sliced key; what each pull held, per element."""
    kv.init("w", np.zeros(4))
    kv.set_updater(_add)
    kv.barrier()
    pulled = []
    for clock in range(1, STEPS + 1):
        time.sleep(sleeps[kv.rank][2 * clock - 2])
        kv.push("w", np.full(4, _bit(kv.rank, clock)))
        time.sleep(sleeps[kv.rank][2 * clock - 1])
        pulled.append((clock, kv.pull("w").tolist()))
    return pulled


sleeps_st = st.lists(
    st.lists(
        st.sampled_from([0.0, 0.0, 0.002, 0.01, 0.03]), min_size=2 * STEPS, max_size=2 * STEPS
    ),
    min_size=2,
    max_size=2,
)


@settings(max_examples=10, deadline=None)
@given(staleness=st.integers(0, 2), sleeps=sleeps_st)
def test_no_pull_returns_before_every_rank_reached_its_clock_minus_s(cluster, staleness, sleeps):
    handle = cluster  # session-scoped: hypothesis runs the body once per example
    results = run(
        _program,
        num_workers=2,
        kvstore="dist_ssp",
        staleness=staleness,
        num_servers=2,
        cluster=handle,
        args=(sleeps,),
        bigarray_bound=2,  # "w" is cut into one slice per server: each slice waits
        timeout=20,
    )
    for rank, pulled in enumerate(results):
        for clock, values in pulled:
            for value in values:
                held = _held(value, 2)
                assert set(range(1, clock + 1)) <= held[rank]  # its own writes
                for other in range(2):
                    assert set(range(1, clock - staleness + 1)) <= held[other], (
                        f"rank {rank}'s pull at clock {clock} (s={staleness}) held only "
                        f"{sorted(held[other])} of rank {other}"
                    )


@settings(max_examples=5, deadline=None)
@given(sleeps=sleeps_st)
def test_staleness_zero_pulls_what_dist_sync_pulls(cluster, sleeps):
    """A dist_sync pull after round c holds exactly the pushes of rounds 1..c; a
    dist_ssp pull with s = 0 holds those too (and, since pushes are applied as
    they arrive, any push of a later round that came first)."""
    common = dict(num_workers=2, num_servers=2, cluster=cluster, args=(sleeps,), timeout=20)
    sync = run(_program, kvstore="dist_sync", **common)
    ssp = run(_program, kvstore="dist_ssp", staleness=0, **common)
    for rank in range(2):
        for (clock, want), (_, got) in zip(sync[rank], ssp[rank], strict=True):
            for w, g in zip(want, got, strict=True):
                assert all(held == set(range(1, clock + 1)) for held in _held(w, 2).values())
                upto = {r: {c for c in h if c <= clock} for r, h in _held(g, 2).items()}
                assert upto == _held(w, 2)


def _turns(kv, order):
    """One push and pull per entry of ``order`` by the rank it names, the others
    waiting at a barrier: a schedule whose outcome does not depend on timing, and
    in which no dist_ssp pull waits with s >= STEPS (no clock exceeds STEPS)."""
    kv.init("w", np.zeros(3, np.float32))
    if kv.rank == 0:
        kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.1, momentum=0.9))
    kv.barrier()
    pulled = []
    for step, turn in enumerate(order):
        if kv.rank == turn:
            kv.push("w", np.full(3, step + 10.0 * kv.rank, np.float32))
            pulled.append(kv.pull("w"))
        kv.barrier()
    return pulled


@settings(max_examples=6, deadline=None)
@given(order=st.permutations([0] * STEPS + [1] * STEPS))
def test_with_no_waiting_ssp_pulls_what_dist_async_pulls(cluster, order):
    common = dict(num_workers=2, num_servers=1, cluster=cluster, args=(order,), timeout=20)
    asynchronous = run(_turns, kvstore="dist_async", **common)
    ssp = run(_turns, kvstore="dist_ssp", staleness=STEPS, **common)
    for want, got in zip(asynchronous, ssp, strict=True):
        assert len(got) == STEPS
        for w, g in zip(want, got, strict=True):
            np.testing.assert_array_equal(g, w)  # the optimizer ran once per push, in order


def _slow_rank_1(kv, staleness):
    kv.init("w", np.zeros(2))
    kv.barrier()
    waited = []
    for _ in range(3):
        if kv.rank == 1:
            time.sleep(0.3)
        kv.push("w", np.ones(2))
        start = time.monotonic()
        kv.pull("w")
        waited.append(time.monotonic() - start)
    return waited


def _rank_1_pushes_once_rank_0_is_done(kv, marker):
    """Rank 0 pushes and pulls 3 times, then says so (``marker``); only then does
    rank 1 push: a pull of rank 0 that waited for rank 1 would never return."""
    import pathlib

    kv.init("w", np.zeros(2))
    kv.barrier()
    if kv.rank == 0:
        for _ in range(3):
            kv.push("w", np.ones(2))
            kv.pull("w")
        pathlib.Path(marker).touch()
    else:
        deadline = time.monotonic() + 60  # only stops a hang: rank 0 waited
        while not pathlib.Path(marker).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        for _ in range(3):
            kv.push("w", np.ones(2))
    kv.barrier()
    return pathlib.Path(marker).exists()


def test_the_fast_rank_waits_for_the_slow_one_only_beyond_the_bound(handle, tmp_path):
    common = dict(num_workers=2, kvstore="dist_ssp", cluster=handle, timeout=20)
    fast, _ = run(_slow_rank_1, staleness=0, args=(0,), **common)
    assert min(fast) > 0.15  # every pull of rank 0 waited for rank 1's push (0.3 s late)
    # never 3 rounds ahead: rank 0's 3 pulls return before rank 1 has pushed at all
    marker = str(tmp_path / "rank 0 done")
    done = run(_rank_1_pushes_once_rank_0_is_done, staleness=3, args=(marker,), **common)
    assert done == [True, True]


def _rank_1_stops(kv):
    kv.init("w", np.zeros(2))
    kv.barrier()
    for _ in range(3 if kv.rank == 0 else 1):
        kv.push("w", np.ones(2))
    return kv.pull("w")


def test_timeout_names_the_slowest_rank_and_its_clock(handle):
    with pytest.raises(
        ClusterError,
        match=r"timed out after 2 s: rank 0's pull of key 'w' at clock 3 \(staleness 1\) "
        r"waits for every rank to reach clock 2; slowest: rank 1 at clock 1",
    ):
        run(
            _rank_1_stops, num_workers=2, kvstore="dist_ssp", staleness=1, cluster=handle, timeout=2
        )


def _list_pushes(kv):
    kv.init(["a", "b"], [np.zeros(2), np.zeros(2)])
    kv.barrier()
    for _ in range(3 if kv.rank == 0 else 1):
        kv.push(["a", "b"], [np.ones(2), np.ones(2)])
    return kv.pull("b")


def test_a_push_of_a_list_of_keys_is_one_round_of_each_key(handle):
    """Three list pushes put rank 0 at clock 3 of "b" (not 6, nor 1), one put rank
    1 at clock 1: with s = 1 rank 0's pull of "b" waits for clock 2, and times out."""
    with pytest.raises(
        ClusterError,
        match=r"rank 0's pull of key 'b' at clock 3 \(staleness 1\) "
        r"waits for every rank to reach clock 2; slowest: rank 1 at clock 1",
    ):
        run(_list_pushes, num_workers=2, kvstore="dist_ssp", staleness=1, cluster=handle, timeout=2)


def _push_twice(kv):
    kv.init("w", np.zeros(2))
    kv.push("w", np.ones(2))
    kv.push("w", np.ones(2))
    return kv.pull("w")


def test_notebook_store_and_shared_run(handle):
    kv = labkv.create("dist_ssp", cluster=handle, num_servers=2, staleness=1)
    try:
        assert (kv.type, kv.staleness) == ("dist_ssp", 1)
        kv.init("w", np.zeros(2))
        for _ in range(3):  # the notebook alone is every rank: it never waits
            kv.push("w", np.ones(2))
        np.testing.assert_array_equal(kv.pull("w"), [1.0, 1.0])
        # A run on the same servers starts its clocks from 0 (else rank 0 would be
        # at clock 5, waiting for rank 1 to reach 4, and time out).
        results = run(_push_twice, num_workers=2, kvstore=kv, timeout=5)
        assert [r.tolist() for r in results] == [[1.0, 1.0]] * 2
    finally:
        kv.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "dist_ssp"}, "needs staleness=s"),
        ({"kind": "dist_ssp", "staleness": -2}, "non-negative int"),
        ({"kind": "dist_sync", "staleness": 1}, "applies to 'dist_ssp' stores only"),
    ],
)
def test_bad_staleness_starts_nothing(handle, kwargs, message):
    from tests._waiting import server_tasks

    before = server_tasks(handle.client)
    kind = kwargs.pop("kind")
    with pytest.raises(ValueError, match=message):
        labkv.create(kind, cluster=handle, **kwargs)
    with pytest.raises(ValueError, match=message):
        run(_rank_1_stops, num_workers=2, kvstore=kind, cluster=handle, **kwargs)
    assert not set(server_tasks(handle.client)) - set(before)  # no new server started


def test_a_shared_store_keeps_its_staleness(handle):
    kv = labkv.create("dist_ssp", cluster=handle, num_servers=1, staleness=0)
    try:
        with pytest.raises(ValueError, match="shared store keeps its own"):
            run(_rank_1_stops, num_workers=2, kvstore=kv, staleness=2)
    finally:
        kv.close()


def _rank_1_sleeps(kv):
    kv.init("w", np.zeros(4))
    for _ in range(6):
        if kv.rank == 1:
            time.sleep(0.25)
        kv.push("w", np.ones(4))
        kv.pull("w")


def test_the_clocks_panel_shows_the_slow_rank_as_slowest(handle):
    import threading

    from labkv.widgets import monitor
    from labkv.widgets._render.tables import clocks_table

    kv = labkv.create("dist_ssp", cluster=handle, num_servers=2, staleness=1)
    mon = monitor(kv)
    seen = []
    try:
        kv.init("w", np.zeros(4))
        errors = []

        def go():
            try:
                run(_rank_1_sleeps, num_workers=2, kvstore=kv, timeout=20)
            except Exception as exc:
                errors.append(exc)

        thread = threading.Thread(target=go)
        thread.start()
        while thread.is_alive():  # what the panel shows while the ranks run
            mon.refresh()
            with mon.model.lock:
                clocks = mon.model.clocks.get("w")
                if clocks is not None and clocks.clocks:
                    seen.append((list(clocks.clocks), clocks.slowest(), dict(clocks.waited)))
            time.sleep(0.05)
        assert not errors, errors
        time.sleep(0.3)
        mon.refresh()
        headers, rows = clocks_table(mon.model)
        text = mon.summary()
    finally:
        mon.close()
        kv.close()
    assert seen, "no clock events reached the monitor"
    assert any(slowest == [1] for _, slowest, _ in seen), seen
    assert not any(slowest == [0] for _, slowest, _ in seen), seen  # the fast rank never lags
    _, _, waited = seen[-1]
    assert waited.get(0, 0.0) > waited.get(1, 0.0)  # the fast rank is the one that waits
    assert headers[:4] == ["key", "staleness", "slowest", "spread"] and rows[0][1] == "1"
    assert "clocks (dist_ssp)" in text
