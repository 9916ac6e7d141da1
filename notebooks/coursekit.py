"""Plumbing the course's notebooks share, kept out of their teaching cells: a Dask
scheduler and workers started as separate processes, as on a real cluster."""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import time


class DaskProcesses:
    """A ``dask scheduler`` and ``dask worker`` processes on this machine, stopped by
    :meth:`stop` or when this process exits. ``commands`` are what a cluster's
    machines would run; ``address`` is the scheduler's."""

    def __init__(self, n_workers: int = 2, timeout: float = 60.0) -> None:
        self.workdir = tempfile.mkdtemp()
        scheduler_file = os.path.join(self.workdir, "scheduler.json")
        dask = [sys.executable, "-m", "dask"]
        self.processes: list[subprocess.Popen] = []
        scheduler = [*dask, "scheduler", "--host", "127.0.0.1", "--port", "0"]
        scheduler += ["--no-dashboard", "--scheduler-file", scheduler_file]
        self._start(scheduler, "scheduler")
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        while not os.path.exists(scheduler_file):
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the scheduler did not start within {timeout:g} s")
            time.sleep(0.1)
        time.sleep(0.1)  # the file is written before it is complete
        with open(scheduler_file) as f:
            self.address = json.load(f)["address"]
        workers = [*dask, "worker", self.address, "--host", "127.0.0.1"]
        workers += ["--nworkers", str(n_workers), "--nthreads", "1", "--no-dashboard"]
        workers += ["--memory-limit", "1GiB", "--local-directory", os.path.join(self.workdir, "w")]
        self._start(workers, "workers")
        self.commands = [" ".join(["dask", *c[3:]]) for c in (scheduler, workers)]

    def _start(self, args: list[str], name: str) -> None:
        log = open(os.path.join(self.workdir, f"{name}.log"), "w")  # noqa: SIM115 (lives with the process)
        self.processes.append(
            subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )

    def stop(self) -> None:
        """Stop the workers, then the scheduler (each process group)."""
        for p in reversed(self.processes):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 2
        for p in reversed(self.processes):
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


# -- waiting for the cluster's reports (notebooks 07 and 08) ------------------------------------


def settle(mon, until=None, timeout: float = 20.0) -> None:
    """Wait until the monitor ``mon`` has heard every report still on its way
    (``mon.settle()``: the servers and ranks send theirs in batches) and, when
    given, ``until(mon.model)`` holds; raises ``TimeoutError`` after ``timeout``
    seconds."""
    deadline = time.monotonic() + timeout
    while True:
        settled = mon.settle(timeout=max(0.0, deadline - time.monotonic()))
        if settled and (until is None or until(mon.model)):
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the monitor's reports did not settle within {timeout:g} s")
        time.sleep(0.1)


def shown_monitor(kv):
    """A monitor of the store ``kv`` (``labkv.widgets.monitor``), displayed under the
    running cell, so that it changes while the cell runs (notebook 07)."""
    from IPython.display import display

    from labkv.widgets import monitor

    mon = monitor(kv)
    display(mon)
    return mon


def last_picture(mon, timeout: float = 20.0) -> None:
    """Wait until the monitor ``mon`` has heard every call of a finished run
    (:meth:`~labkv.widgets.Monitor.settle`: the servers report the pushes and the ranks
    their own pulls, a batch later), print the first section of its text summary (its
    counts), and close it: its last picture stays on the page, whole (notebook 07)."""
    mon.settle(timeout=timeout)
    print(mon.summary(events=0).split("\n\n")[0])
    mon.close()


def push_until_it_fails(kv, keys, values, every: float = 0.1, tries: int = 100):
    """Push ``values`` to ``keys`` and pull them, every ``every`` seconds, until a call
    raises :class:`labkv.cluster.ClusterError` (notebook 08: a server's worker was
    killed); returns that error and the seconds it took. Raises ``TimeoutError`` when
    ``tries`` rounds of calls all succeed."""
    from labkv.cluster import ClusterError

    started = time.monotonic()
    for _ in range(tries):
        try:
            kv.push(keys, values)
            kv.pull(keys)
        except ClusterError as err:
            return err, time.monotonic() - started
        time.sleep(every)
    raise TimeoutError(f"{tries} pushes and pulls went through: no call failed")


def wait_for_reseed(kv, handle, events, workers: int, timeout: float = 60.0) -> None:
    """Wait until a replicated store ``kv`` seeded a new backup (a ``reseed`` among
    ``events``, the events the notebook collected) and the cluster ``handle`` has
    ``workers`` workers again (the nanny restarts a killed one). The store looks
    for a worker to seed on when a call of it is answered: until the re-seed, this
    peeks at its keys every 0.5 s (where a free worker is at hand the failover itself
    seeds, and nothing is asked). A peek reads the servers' values with no event, so
    the monitor's event log holds the training's calls only, none of this wait's."""
    deadline = time.monotonic() + timeout
    while not any(e.op == "reseed" for e in events):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no new backup was seeded within {timeout:g} s")
        time.sleep(0.5)
        if not any(e.op == "reseed" for e in events):
            keys = kv.keys()
            for key in keys:
                kv.peek(key)  # a call answered, and no event: not a pull in the log
    while len(handle.workers()) < workers:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the cluster has not {workers} workers again after {timeout:g} s")
        time.sleep(0.2)


# -- notebooks 05 and 05b: runs in the background, sampling, the monitor's text --


class Background:
    """``fn(*args, **kwargs)`` running in a thread of this kernel, so that the
    notebook can look at the monitor while it runs; :meth:`join` waits and returns
    its result (or raises what it raised)."""

    def __init__(self, fn, *args, **kwargs) -> None:
        import threading

        self._result: list = []
        self._error: list = []

        def target() -> None:
            try:
                self._result.append(fn(*args, **kwargs))
            except BaseException as exc:  # handed to join
                self._error.append(exc)

        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self):
        self._thread.join()
        if self._error:
            raise self._error[0]
        return self._result[0]


def in_background(fn, *args, **kwargs) -> Background:
    """Start ``fn(*args, **kwargs)`` in a thread; ``.join()`` returns its result."""
    return Background(fn, *args, **kwargs)


def sample_while(fn, read, every: float = 0.01):
    """Run ``fn()`` in a thread and call ``read()`` every ``every`` seconds until
    it returns, and once more after: ``(fn's result, [(time.time(), read()), ...])``.
    Notebook 05 reads the servers' model this way (``kv.peek``) while the ranks train."""
    job = Background(fn)
    samples = []
    while not job.done():
        samples.append((time.time(), read()))
        time.sleep(every)
    result = job.join()
    samples.append((time.time(), read()))
    return result, samples


def summary_section(summary: str, title: str) -> str:
    """The section of a monitor's text summary (``mon.summary()``) whose first line
    starts with ``title`` (e.g. ``"fan-in"``), up to the next blank line."""
    lines, found = [], False
    for line in summary.splitlines():
        if not found and line.startswith(title):
            found = True
        elif found and not line.strip():
            break
        if found:
            lines.append(line)
    return "\n".join(lines) if found else f"(no {title!r} section in the summary)"
