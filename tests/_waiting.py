"""Bounded waiting for something another thread or process makes true, and what
the scheduler still holds."""

from __future__ import annotations

import threading
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


def in_threads(*fns: Callable[[], object], timeout: float = 20.0) -> list[object]:
    """Run ``fns`` at once, each in a thread (ranks that wait for each other), and
    return their results; the first error is raised here, and a thread still
    running after ``timeout`` seconds is an error naming it."""
    results: list[object] = [None] * len(fns)
    errors: list[BaseException] = []

    def run(i: int, fn: Callable[[], object]) -> None:
        try:
            results[i] = fn()
        except Exception as exc:  # re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, fn), daemon=True) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    if errors:
        raise errors[0]
    hung = [i for i, t in enumerate(threads) if t.is_alive()]
    if hung:
        raise TimeoutError(f"functions {hung} still running after {timeout:g} s")
    return results


def server_tasks(client, store_id: str = "") -> list[str]:
    """The keys of the server tasks the scheduler still holds (of one store, with
    ``store_id``), sorted: what a start that failed must not leave behind."""
    prefix = f"labkv-server-{store_id}"

    def tasks(dask_scheduler):
        return sorted(str(k) for k in dask_scheduler.tasks if str(k).startswith(prefix))

    return client.run_on_scheduler(tasks)
