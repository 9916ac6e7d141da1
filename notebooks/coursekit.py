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
