"""Background tasks, kept until they are done (written once, as distributed's
``AsyncTaskGroup``): used by the servers and by the streams."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable


def _retrieve(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()


class TaskGroup:
    """Tasks nobody awaits (a server's votes, log entries on their way to the
    backups, watchers; a stream's readers and answers), each held until done:
    the loop keeps only weak references to its tasks.

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
