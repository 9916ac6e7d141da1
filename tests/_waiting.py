"""Bounded waiting for something another thread or process makes true, and what
the scheduler still holds."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0, poll: float = 0.02) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return bool(predicate())


def server_tasks(client, store_id: str = "") -> list[str]:
    """The keys of the server tasks the scheduler still holds (of one store, with
    ``store_id``), sorted: what a start that failed must not leave behind."""
    prefix = f"labkv-server-{store_id}"

    def tasks(dask_scheduler):
        return sorted(str(k) for k in dask_scheduler.tasks if str(k).startswith(prefix))

    return client.run_on_scheduler(tasks)
