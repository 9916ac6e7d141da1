"""How a server's coroutines wait (``labkv.cluster._server.waiting.Waiters``), on a
plain event loop: every wait times out on its own deadline, naming what is
missing, and a hold pushes the deadlines back."""

from __future__ import annotations

import asyncio
import time

import pytest

from labkv.cluster._errors import ClusterError
from labkv.cluster._server.waiting import Waiters


async def _timed_wait(waiters: Waiters, what: str) -> tuple[float, str]:
    """Seconds until the wait for ``what`` (never ready) raised, and its error."""
    start = time.monotonic()
    with pytest.raises(ClusterError) as raised:
        await waiters.until(lambda: False, lambda: what)
    return time.monotonic() - start, str(raised.value)


def test_each_wait_times_out_on_its_own_deadline_naming_what_is_missing():
    async def main():
        waiters = Waiters("server 0", 0.2)
        first = asyncio.ensure_future(_timed_wait(waiters, "rank 1's push"))
        await asyncio.sleep(0.1)
        second = asyncio.ensure_future(_timed_wait(waiters, "rank 2's push"))
        return await asyncio.wait_for(asyncio.gather(first, second), 10)

    (first_s, first), (second_s, second) = asyncio.run(main())
    assert first_s >= 0.2 and second_s >= 0.2  # neither woken by the other's deadline
    assert first == "server 0 timed out after 0.2 s: rank 1's push"
    assert second == "server 0 timed out after 0.2 s: rank 2's push"


def test_a_hold_pushes_every_deadline_back_and_a_ready_wait_returns():
    async def main():
        waiters = Waiters("server 0", 0.05)
        ready = []
        woken = asyncio.ensure_future(waiters.until(lambda: bool(ready), lambda: "never"))
        waiters.hold(1.0)  # a lost rank is being replaced
        held = asyncio.ensure_future(_timed_wait(waiters, "rank 1"))
        # past the 0.05 s timeout, well within the hold even on a busy machine
        await asyncio.sleep(0.1)
        assert not woken.done() and not held.done()
        ready.append(True)
        waiters.wake()
        await asyncio.wait_for(woken, 10)
        return await asyncio.wait_for(held, 10)

    seconds, error = asyncio.run(main())
    assert seconds >= 1.0 and error.endswith("rank 1")
