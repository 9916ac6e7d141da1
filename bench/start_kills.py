"""A worker SIGKILLed while a store's servers start: seconds from the kill to
the error, and the error.

    python bench/start_kills.py [--timeout=120] [--replicas=2] [--repeat=3]

An embedded LocalCluster of 3 workers. Two moments:

- ``queued``: the victim's only thread runs a sleep, so the servers pinned to
  it wait in its queue when it is killed (the start waits on tasks that can
  never run);
- ``before check``: the worker list is taken, the victim killed and dropped by
  the scheduler, then ``labkv.create(..., server_workers=that list)`` (the kill
  at 0 s: labkv's check of the workers meets the dead one).

A benchmark, not a test: it prints, it asserts nothing.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time


def _arg(name, default):
    for a in sys.argv[1:]:
        if a.startswith(f"--{name}="):
            return type(default)(a.split("=", 1)[1])
    return default


def _wait(predicate, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def _outcome(exc):
    return "no error" if exc is None else f"{type(exc).__name__}: {str(exc)[:160]}"


def queued(handle, timeout, replicas):
    import labkv

    client = handle.client
    client.wait_for_workers(3, timeout=120)
    victim = handle.workers()[1]
    pid = client.run(os.getpid, workers=[victim])[victim]
    blocker = client.submit(
        time.sleep, 600, workers=[victim], allow_other_workers=False, pure=False
    )
    _wait(lambda: client.processing(victim)[victim], 30)
    outcome = {}

    def create():
        try:
            labkv.create(
                "dist_sync", cluster=handle, num_servers=2, replicas=replicas, timeout=timeout
            ).close()
            outcome["error"] = None
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=create, daemon=True)
    thread.start()
    _wait(
        lambda: any("labkv-server-" in str(k) for k in client.processing(victim).get(victim, [])),
        60,
    )
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    thread.join(timeout=timeout + 60)
    client.cancel([blocker])
    return time.monotonic() - killed, outcome.get("error", "still waiting")


def before_check(handle, timeout, replicas):
    import labkv

    client = handle.client
    client.wait_for_workers(3, timeout=120)
    workers = handle.workers()
    victim = workers[2]
    pid = client.run(os.getpid, workers=[victim])[victim]
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    _wait(lambda: victim not in handle.workers(), 30)
    try:
        labkv.create(
            "dist_sync",
            cluster=handle,
            num_servers=2,
            replicas=replicas,
            timeout=timeout,
            server_workers=workers,
        ).close()
        error = None
    except Exception as exc:
        error = exc
    return time.monotonic() - killed, error


def main():
    from labkv.cluster import connect

    timeout = _arg("timeout", 120.0)
    replicas = _arg("replicas", 2)
    repeat = _arg("repeat", 3)
    handle = connect(n_workers=3, dashboard_address=None, memory_limit="1GiB", set_as_default=False)
    try:
        for name, case in (("queued", queued), ("before check", before_check)):
            for _ in range(repeat):
                seconds, error = case(handle, timeout, replicas)
                print(
                    f"{name}: {seconds:.1f} s after the kill (timeout {timeout:g} s): {_outcome(error)}"
                )
    finally:
        handle.close()


if __name__ == "__main__":
    main()
