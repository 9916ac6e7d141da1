"""A reusable barrier over ``distributed.Event``, counted by generation.

Generation ``g`` of rank ``r`` is the scheduler event ``<name>/g<g>/r<r>``.
A rank sets its own event and waits for the others' events of the same
generation; all of it (the set, the clear below and the waits) goes to the
scheduler concurrently from one coroutine (one ``client.sync``), so a barrier
costs about one scheduler round trip after the last rank arrives.

Why one event per rank and generation (not one shared counter): nobody has
to clear an event that someone else may still be about to wait on. A rank
clears its own event of generation ``g - 2`` when it enters ``g``: having
passed ``g - 1`` it knows every rank *set* its ``g - 1`` event, which each
did only after leaving ``g - 2``, so no waiter of ``g - 2`` is left. At most
two events per rank live on the scheduler; back-to-back reuse cannot miss a
set (the classic single-event barrier does, see the recipes).

Waits are sliced (``_SLICE_S``) so that an aborted run (``<name>/abort``,
set by :func:`labkv.cluster.run` when a rank fails) frees waiting ranks in
well under a second, and a timeout names the ranks that never arrived.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .._errors import ClusterError

_SLICE_S = 0.5


def event_name(name: str, gen: int, rank: int) -> str:
    """The scheduler event that rank ``rank`` sets on reaching generation ``gen``."""
    return f"{name}/g{gen}/r{rank}"


def abort_name(name: str) -> str:
    """The scheduler event that aborts every wait of barrier ``name``."""
    return f"{name}/abort"


class EventBarrier:
    """The barrier of ``parties`` ranks named ``name`` (see module doc).

    >>> EventBarrier("labkv-demo", rank=0, parties=1).wait()  # one party: returns at once
    0
    """

    def __init__(self, name: str, rank: int, parties: int, timeout: float = 120.0):
        self.name, self.rank, self.parties, self.timeout = name, rank, parties, timeout
        self.generation = 0

    def _event(self, gen: int, rank: int) -> str:
        return event_name(self.name, gen, rank)

    def wait(self, client: Any = None) -> int:
        """Wait until all ranks arrive; the generation just completed."""
        gen = self.generation
        self.generation += 1
        if self.parties == 1:
            return gen
        if client is None:
            from distributed import get_client

            client = get_client()
        client.sync(self._wait_async, client.scheduler, gen)
        return gen

    async def _wait_async(self, scheduler: Any, gen: int) -> None:
        # Setting our event and waiting for the others' go out together: a
        # barrier costs one scheduler round trip after the last rank arrives.
        sets = [scheduler.event_set(name=self._event(gen, self.rank))]
        if gen >= 2:
            sets.append(scheduler.event_clear(name=self._event(gen - 2, self.rank)))
        others = [q for q in range(self.parties) if q != self.rank]
        deadline = time.monotonic() + self.timeout
        first = True
        while others:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClusterError(
                    f"barrier {self.name!r} generation {gen} timed out after {self.timeout:g} s: "
                    f"ranks {others} have not arrived"
                )
            waits = [
                scheduler.event_wait(name=self._event(gen, q), timeout=min(left, _SLICE_S))
                for q in others
            ]
            if first:
                *_, arrived = await asyncio.gather(asyncio.gather(*sets), asyncio.gather(*waits))
                first = False
            else:
                arrived = await asyncio.gather(*waits)
            others = [q for q, ok in zip(others, arrived, strict=True) if not ok]
            if others and await scheduler.event_is_set(name=abort_name(self.name)):
                raise ClusterError(f"barrier {self.name!r}: the run was aborted")


def clear_barrier(client: Any, name: str, parties: int, generations: list[int]) -> None:
    """Remove a finished run's barrier events (``generations[r]``: rank r's count).

    Ranks cannot do it themselves: a rank that leaves the last barrier first
    would clear an event another rank has not yet seen.
    """

    async def clear() -> None:
        names = [
            event_name(name, g, r)
            for r, count in zip(range(parties), generations)
            for g in (count - 1, count - 2)
            if g >= 0
        ]
        names.append(abort_name(name))
        await asyncio.gather(*(client.scheduler.event_clear(name=n) for n in names))

    client.sync(clear)
