"""How a server's coroutines wait for its state to change, with a deadline
(:class:`Waiters`), and the tasks nobody waits for (:class:`TaskGroup`).

A waiter is a bare future checked by :meth:`Waiters.wake` after every state
change: the waiting coroutine resumes in the loop's next iteration (an
``asyncio.Condition`` with ``wait_for`` took a task and several iterations to
hand the lock around, on the path of every pull).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from .._errors import ClusterError


def _expire(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)  # the waiter re-checks, then names what is missing


class Waiters:
    """The waiting coroutines of server ``name`` (e.g. ``'server 1'``); each
    wait gives up after ``timeout`` seconds naming what is missing."""

    __slots__ = ("name", "timeout", "aborted", "_waiting")

    def __init__(self, name: str, timeout: float) -> None:
        self.name, self.timeout = name, timeout
        self.aborted: str | None = None  # why every wait fails now (an aborted run)
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
            left = deadline - time.monotonic()
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

    def resume(self) -> None:
        """Waits may succeed again (a new run on the same servers)."""
        self.aborted = None


def _retrieve(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()


class TaskGroup:
    """Calls a server makes without waiting for them (votes, log entries on
    their way to the backups, watchers), each held until done: the loop
    keeps only weak references to its tasks.

    >>> async def main():
    ...     tasks = TaskGroup()
    ...     task = tasks.spawn(asyncio.sleep(0))
    ...     held = len(tasks)
    ...     await task
    ...     await asyncio.sleep(0)  # the done-callbacks run
    ...     return held, len(tasks)
    >>> asyncio.run(main())
    (1, 0)
    """

    __slots__ = ("_tasks",)

    def __init__(self) -> None:
        self._tasks: set[asyncio.Future] = set()

    def spawn(self, call: Awaitable, quiet: bool = False) -> asyncio.Future:
        """Run ``call`` as a task. ``quiet``: its error is retrieved and
        dropped (the caller learns of it another way, e.g. a lost peer as the
        update that times out naming it)."""
        task = asyncio.ensure_future(call)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if quiet:
            task.add_done_callback(_retrieve)
        return task

    def __len__(self) -> int:
        return len(self._tasks)
