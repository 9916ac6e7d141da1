"""How a server's coroutines wait for its state to change, with a deadline
(:class:`Waiters`), and the barriers of the ranks (:class:`Barriers`).

A waiter is a bare future checked by :meth:`Waiters.wake` after every state
change: the waiting coroutine resumes in the loop's next iteration (an
``asyncio.Condition`` with ``wait_for`` took a task and several iterations to
hand the lock around, on the path of every pull).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

from .._errors import ClusterError


def _expire(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)  # the waiter re-checks, then names what is missing


class Waiters:
    """The waiting coroutines of server ``name`` (e.g. ``'server 1'``); each
    wait gives up after ``timeout`` seconds naming what is missing."""

    __slots__ = ("name", "timeout", "aborted", "held_until", "_waiting")

    def __init__(self, name: str, timeout: float) -> None:
        self.name, self.timeout = name, timeout
        self.aborted: str | None = None  # why every wait fails now (an aborted run)
        self.held_until = 0.0  # no wait times out before (a rank is being replaced)
        self._waiting: dict[asyncio.Future, Callable[[], bool]] = {}

    async def until(self, ready: Callable[[], bool], missing: Callable[[], str]) -> None:
        """Wait until ``ready()``; on timeout raise naming ``missing()``."""
        if ready():
            return
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self.timeout
        while not ready():
            if self.aborted is not None:
                raise ClusterError(f"{self.name}: {self.aborted}")
            left = max(deadline, self.held_until) - time.monotonic()
            if left <= 0:
                raise ClusterError(f"{self.name} timed out after {self.timeout:g} s: {missing()}")
            future = loop.create_future()
            self._waiting[future] = ready
            timer = loop.call_later(left, _expire, future)
            try:
                await future
            finally:
                timer.cancel()
                self._waiting.pop(future, None)

    def wake(self) -> None:
        """Wake the waiters whose condition now holds (all of them after an abort)."""
        if not self._waiting:
            return
        for future, ready in list(self._waiting.items()):
            if future.done() or self.aborted is not None or ready():
                del self._waiting[future]
                if not future.done():
                    future.set_result(None)

    def abort(self, reason: str) -> None:
        """Fail every wait, now and from now on, with ``reason``."""
        self.aborted = reason
        self.wake()

    def hold(self, seconds: float) -> None:
        """No wait times out within ``seconds`` from now (a lost rank is being
        replaced: the rounds it holds up must wait for its replacement)."""
        self.held_until = max(self.held_until, time.monotonic() + seconds)

    def resume(self) -> None:
        """Waits may succeed again (a new run on the same servers)."""
        self.aborted = None


class Barriers:
    """The barriers of the runs on a server (held on server 0 of a store):
    generation ``g`` of run ``group`` is passed once ``parties`` ranks entered
    it. Arrivals are a set, so an arrival made again (after a failover) counts
    once; one at a generation already passed returns at once (the others left
    before the primary that passed it was lost). Every replica of server 0
    holds the arrivals: a rank sends its arrival to the backups too
    (:meth:`arrive`, not waited for: the primary answers), so that after a
    failover the new primary passes ``g`` without the ranks the old one had
    released. Each arrival at the primary names the backups that rank sent it
    to (``told``): :meth:`told_everyone` says whether every backup holds every
    arrival of the generation just passed, so that the primary need not log
    that it passed it."""

    __slots__ = ("arrived", "dropped", "passed", "told", "told_passed", "waiting")

    def __init__(self, waiting: Waiters) -> None:
        self.waiting = waiting
        self.passed: dict[str, Any] = {}  # group -> the last generation passed
        self.arrived: dict[tuple[str, Any], set[int]] = {}
        self.dropped: dict[str, set[int]] = {}  # group -> ranks it goes on without
        # (group, generation) -> the backups every arrival so far was sent to
        # too (empty once one came otherwise: an arrival a backup sent on, or
        # one restored from a snapshot); of the generation passed last, by group
        self.told: dict[tuple[str, Any], frozenset[str]] = {}
        self.told_passed: dict[str, tuple[Any, frozenset[str]]] = {}

    def snapshot(self) -> tuple[dict, dict, dict]:
        """What a new replica of server 0 takes: the generations passed, the
        arrivals at open ones (a replacement's barrier reaches it too) and the
        ranks dropped."""
        arrived = {k: set(v) for k, v in self.arrived.items()}
        return dict(self.passed), arrived, {g: set(r) for g, r in self.dropped.items()}

    def restore(self, snap: tuple[dict, dict, dict]) -> None:
        self.passed, self.arrived = dict(snap[0]), {k: set(v) for k, v in snap[1].items()}
        self.dropped = {g: set(r) for g, r in snap[2].items()}
        self.told = dict.fromkeys(self.arrived, frozenset())
        self.told_passed = {}
        self.waiting.wake()

    def passed_on_primary(self, group: str, generation: Any) -> None:
        """The primary passed ``generation``: so has this replica (it may lack
        arrivals made before its seed)."""
        last = self.passed.get(group)
        if last is None or last < generation:
            self.passed[group] = generation
        for done in [k for k in self.arrived if k[0] == group and k[1] <= generation]:
            del self.arrived[done]
            self.told.pop(done, None)
        self.waiting.wake()

    def drop(self, group: str, rank: int) -> None:
        """Run ``group`` goes on without ``rank`` (``on_rank_loss="shrink"``):
        its barriers pass once every other rank entered them.

        >>> import asyncio
        >>> b = Barriers(Waiters("server 0", 1.0))
        >>> async def rank_2_lost():
        ...     first = asyncio.ensure_future(b.enter("run", 0, 1, parties=3))
        ...     second = asyncio.ensure_future(b.enter("run", 1, 1, parties=3))
        ...     await asyncio.sleep(0)  # both wait for rank 2
        ...     b.drop("run", 2)
        ...     return await first, await second
        >>> asyncio.run(rank_2_lost()), b.passed  # one of them passed it
        ((True, False), {'run': 1})
        """
        self.dropped.setdefault(group, set()).add(rank)
        self.waiting.wake()

    def _pass(self, group: str, generation: Any) -> None:
        self.passed[group] = generation
        self.arrived.pop((group, generation), None)
        self.told_passed[group] = (generation, self.told.pop((group, generation), frozenset()))
        self.waiting.wake()

    def _note_told(self, group: str, generation: Any, told: frozenset[str]) -> None:
        """An arrival that was sent to the backups ``told`` too."""
        key = (group, generation)
        before = self.told.get(key)
        self.told[key] = told if before is None else before & told

    def told_everyone(self, group: str, generation: Any, backups: set[str]) -> bool:
        """Whether every arrival at ``generation``, just passed here, was sent to
        each of ``backups`` (actor keys) too, and no rank of ``group`` was
        dropped: then every backup passes it on its own.

        >>> async def both(told_by_rank_1):
        ...     b = Barriers(Waiters("server 0", 1.0))
        ...     first = asyncio.ensure_future(b.enter("run", 0, 1, 2, told={"b1", "b2"}))
        ...     await asyncio.sleep(0)
        ...     await b.enter("run", 1, 1, 2, told=told_by_rank_1)
        ...     await first
        ...     return b.told_everyone("run", 1, {"b1", "b2"})
        >>> asyncio.run(both({"b1", "b2"})), asyncio.run(both({"b1"}))
        (True, False)
        """
        last = self.told_passed.get(group)
        if last is None or last[0] != generation or self.dropped.get(group):
            return False
        return backups <= last[1]

    def _passed(self, group: str, generation: Any) -> bool:
        last = self.passed.get(group)
        return last is not None and generation <= last

    def _complete(self, group: str, arrived: set[int], parties: int) -> bool:
        dropped = self.dropped.get(group)
        if not dropped:
            return len(arrived) >= parties
        return set(range(parties)) <= arrived | dropped

    def arrive(self, group: str, rank: int, generation: Any, parties: int) -> None:
        """Count ``rank``'s arrival at ``generation`` without waiting (a backup's
        copy of the primary's barrier); the arrival that completes it passes it.

        >>> b = Barriers(Waiters("server 0", 1.0))
        >>> b.arrive("run", 0, 1, parties=2); b.passed
        {}
        >>> b.arrive("run", 1, 1, parties=2); b.passed, b.arrived
        ({'run': 1}, {})
        """
        if self._passed(group, generation):
            return
        arrived = self.arrived.setdefault((group, generation), set())
        arrived.add(rank)
        self._note_told(group, generation, frozenset())  # if it becomes the primary
        if self._complete(group, arrived, parties):
            self._pass(group, generation)

    async def enter(
        self,
        group: str,
        rank: int,
        generation: Any,
        parties: int,
        told: Iterable[str] = (),
    ) -> bool:
        """Return once every rank of ``range(parties)`` entered ``generation``
        (an int, or a rank's ``(phase, n)``, see :mod:`labkv.cluster._rank.steps`:
        generations of one group are ordered), but those dropped; on timeout
        raise naming the ranks that did not. Whether this arrival passed it.
        ``told``: the backups this rank sent its arrival to as well."""

        def passed() -> bool:
            return self._passed(group, generation)

        def complete() -> bool:
            return self._complete(group, arrived, parties)

        if passed():
            return False
        arrived = self.arrived.setdefault((group, generation), set())
        arrived.add(rank)
        self._note_told(group, generation, frozenset(told))
        if not complete():

            def missing() -> str:
                absent = sorted(set(range(parties)) - arrived - self.dropped.get(group, set()))
                return (
                    f"barrier {group!r} {generation_name(generation)} (of {parties} ranks): "
                    f"ranks {absent} have not arrived"
                )

            await self.waiting.until(lambda: passed() or complete(), missing)
            if passed():
                return False
        self._pass(group, generation)
        return True


def generation_name(generation: Any) -> str:
    """A barrier's generation as an error names it (a rank's ``(phase, n)``:
    see :mod:`labkv.cluster._rank.steps`).

    >>> generation_name(3), generation_name((1, 0)), generation_name((6, 1)), generation_name((9, 0))
    ('generation 3', 'generation 0 before any step', 'generation 1 of step 2', 'generation 0 after step 3')
    """
    if not isinstance(generation, tuple):
        return f"generation {generation}"
    phase, n = generation
    if phase == 1:
        return f"generation {n} before any step"
    if phase % 2 == 0:
        return f"generation {n} of step {phase // 2 - 1}"
    return f"generation {n} after step {(phase - 1) // 2 - 1}"
