"""dist_ssp clocks as plain logic (no Dask): 3 ranks on random schedules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkv.cluster._options import check_staleness
from labkv.cluster._server.ssp_clocks import Clocks


@settings(max_examples=200, deadline=None)
@given(
    staleness=st.integers(0, 3),
    workers=st.integers(2, 3),
    steps=st.integers(1, 6),
    picks=st.lists(st.integers(0, 2), min_size=60, max_size=60),
)
def test_a_random_schedule_finishes_and_no_pull_sees_less_than_the_bound(
    staleness, workers, steps, picks
):
    """Each rank runs ``steps`` x (push, pull); a scheduler picks a rank that can
    go on (a pull only when ``ready``). Every schedule finishes (no deadlock),
    and each pull by a rank at clock c happens when every rank is at c - s or more."""
    clocks = Clocks(staleness, workers)
    done = [0] * workers  # ops done per rank: even = next is a push, odd = next is a pull
    picks = iter(picks)
    while any(d < 2 * steps for d in done):
        runnable = [
            r
            for r in range(workers)
            if done[r] < 2 * steps and (done[r] % 2 == 0 or clocks.ready("w", r))
        ]
        assert runnable, f"deadlock: clocks {clocks.of('w')}, ops done {done}"
        rank = runnable[next(picks, 0) % len(runnable)]
        if done[rank] % 2 == 0:
            clocks.tick(rank, ["w"])
        else:
            c = clocks.clock("w", rank)
            assert min(clocks.of("w").values()) >= c - staleness
        done[rank] += 1
    assert clocks.of("w") == dict.fromkeys(range(workers), steps)


def test_staleness_zero_waits_for_every_rank_and_names_the_slowest():
    c = Clocks(0, 3)
    c.tick(0, ["a", "b"])  # a list push is one round of each key
    c.tick(2, ["a"])
    assert c.of("a") == {0: 1, 1: 0, 2: 1} and c.of("b") == {0: 1, 1: 0, 2: 0}
    assert not c.ready("a", 0)
    assert c.slowest("a") == ([1], 0)
    assert "slowest: rank 1 at clock 0" in c.behind("a", 0)
    c.tick(1, ["a"])
    assert c.ready("a", 0) and not c.ready("b", 0)
    assert c.ready("a", 1) and c.ready("b", 1)  # rank 1 never pushed b: it needs clock 0
    c.reset(2)
    assert c.of("a") == {0: 0, 1: 0}


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_bad_staleness_is_refused(bad):
    with pytest.raises(ValueError, match="staleness must be a non-negative int"):
        check_staleness("dist_ssp", bad)


def test_a_senders_rank_is_learnt_from_its_pushes_and_kept_for_the_next_run():
    c = Clocks(staleness=0, num_workers=2)
    c.pushed("a", 1, ["w"])
    assert c.ranks == {"a": 1} and c.of("w") == {0: 0, 1: 1}
    c.reset(3)
    assert c.ranks == {"a": 1} and c.of("w") == {0: 0, 1: 0, 2: 0}
