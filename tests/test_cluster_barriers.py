"""The ranks' barrier as a server holds it (``labkv.cluster._server.waiting.Barriers``),
on a plain event loop: no Dask. A generation passes when the last rank enters it,
an arrival made again counts once, one at a passed generation returns at once, the
timeout names the ranks that never came, and an abort wakes every waiter."""

from __future__ import annotations

import asyncio

import pytest

from labkv.cluster._errors import ClusterError
from labkv.cluster._server.waiting import Barriers, Waiters


def _barriers(timeout=2.0):
    waiting = Waiters("server 0", timeout)
    return waiting, Barriers(waiting)


def test_a_generation_passes_when_the_last_rank_enters_it_in_any_order():
    async def main():
        _, barriers = _barriers()
        entered = [asyncio.ensure_future(barriers.enter("run", r, 0, 3)) for r in (2, 0)]
        await asyncio.sleep(0.01)
        assert not any(e.done() for e in entered)
        await barriers.enter("run", 1, 0, 3)  # the last: returns at once
        await asyncio.wait_for(asyncio.gather(*entered), 1)
        assert barriers.passed == {"run": 0} and barriers.arrived == {}

    asyncio.run(main())


def test_an_arrival_made_again_counts_once_and_a_passed_generation_returns_at_once():
    async def main():
        _, barriers = _barriers()
        first = asyncio.ensure_future(barriers.enter("run", 0, 0, 2))
        again = asyncio.ensure_future(barriers.enter("run", 0, 0, 2))  # after a failover
        await asyncio.sleep(0.01)
        assert not first.done() and not again.done()  # rank 0 twice is not two ranks
        await barriers.enter("run", 1, 0, 2)
        await asyncio.wait_for(asyncio.gather(first, again), 1)
        # a straggler's arrival made again at the generation passed meanwhile
        await asyncio.wait_for(barriers.enter("run", 1, 0, 2), 0.1)
        assert barriers.arrived == {}

    asyncio.run(main())


def test_runs_and_generations_are_counted_apart():
    async def main():
        _, barriers = _barriers()
        await barriers.enter("solo", 0, 0, 1)
        await barriers.enter("solo", 0, 1, 1)
        other = asyncio.ensure_future(barriers.enter("pair", 0, 0, 2))
        await asyncio.sleep(0.01)
        assert not other.done()  # the solo run's generations pass nothing of the pair's
        await barriers.enter("pair", 1, 0, 2)
        await asyncio.wait_for(other, 1)
        assert barriers.passed == {"solo": 1, "pair": 0}

    asyncio.run(main())


def test_the_timeout_names_the_ranks_that_did_not_arrive():
    async def main():
        _, barriers = _barriers(timeout=0.2)
        waiting = [asyncio.ensure_future(barriers.enter("run", r, 0, 4)) for r in (0, 2)]
        with pytest.raises(ClusterError) as caught:
            await asyncio.gather(*waiting)
        return str(caught.value)

    message = asyncio.run(main())
    assert message == (
        "server 0 timed out after 0.2 s: barrier 'run' generation 0 (of 4 ranks): "
        "ranks [1, 3] have not arrived"
    )


def test_an_abort_wakes_every_waiting_rank_with_its_reason():
    async def main():
        waiting, barriers = _barriers(timeout=30)
        entered = [asyncio.ensure_future(barriers.enter("run", r, 0, 3)) for r in (0, 1)]
        await asyncio.sleep(0.01)
        waiting.abort("the run was interrupted")
        results = await asyncio.wait_for(asyncio.gather(*entered, return_exceptions=True), 1)
        return results

    for result in asyncio.run(main()):
        assert isinstance(result, ClusterError)
        assert str(result) == "server 0: the run was interrupted"
