"""Plumbing the course's notebooks share, kept out of their teaching cells: a Dask
scheduler and workers started as separate processes, as on a real cluster."""

from __future__ import annotations

import atexit
import json
import os
import pickle
import shutil
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


# -- notebook 12: torch.distributed process groups ----------------------------------------------


class RankFailed(RuntimeError):
    """A rank of :func:`spawn_ranks` raised, died or did not exit in time; the message
    names each such rank and ends with the tail of its output."""


def spawn_ranks(fn, world_size: int = 2, args: tuple = (), timeout: float = 60.0) -> list:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh Python processes that
    form one ``torch.distributed`` process group (backend gloo, on the CPU), and return
    their results, rank 0's first (each must pickle).

    ``fn`` may be defined in the notebook: it travels by value (cloudpickle, as Dask
    ships a rank function), so a process need not import the notebook. The group is
    initialised from a file (``init_method="file://..."``: no port to find or to
    race for). Every rank, once ``fn`` returns, waits at ``dist.barrier()`` for the
    others before ``dist.destroy_process_group()``, so no rank tears the group down
    while another still uses it, and then leaves with ``os._exit(0)``, which skips the
    interpreter's teardown of objects that hold the group's sockets. The processes are
    joined with ``timeout``: one still running then is killed. When a rank raises or
    dies, the others are given 5 s and then killed, and :class:`RankFailed` names every
    rank that failed, the first to fail first (what it raised, or its exit code or
    signal; a rank that failed because it lost a peer comes after the others), with
    that rank's traceback and the end of its output. Each process uses
    one thread (``torch.set_num_threads(1)``) and returns the memory of large buffers
    when it frees them."""
    import cloudpickle

    workdir = tempfile.mkdtemp(prefix="ranks-")
    with open(os.path.join(workdir, "job.pkl"), "wb") as f:
        cloudpickle.dump((fn, tuple(args)), f)
    kit = os.path.dirname(os.path.abspath(__file__))
    entry = f"import sys; sys.path.insert(0, {kit!r}); import coursekit; coursekit._rank_process()"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore::FutureWarning"}
    # Buffers of 1 MiB or more are mapped, and unmapped when freed: glibc's own threshold
    # rises once such a buffer is freed, and the ranks would keep every large size they
    # ever used (about 100 MiB more per rank in notebook 12's benchmark).
    env["MALLOC_MMAP_THRESHOLD_"] = "1048576"
    procs, logs = [], []
    for rank in range(world_size):
        log = open(os.path.join(workdir, f"rank{rank}.log"), "w")  # noqa: SIM115 (lives with the process)
        logs.append(log)
        command = [sys.executable, "-c", entry, workdir, str(rank), str(world_size), str(timeout)]
        procs.append(
            subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        )
    deadline, grace, ended = time.monotonic() + timeout, None, {}
    try:
        while len(ended) < world_size:
            now = time.monotonic()
            for rank, p in enumerate(procs):
                if rank not in ended and p.poll() is not None:
                    ended[rank] = now  # when it ended: the first to fail is named first
            if grace is None and any(procs[rank].returncode != 0 for rank in ended):
                grace = now + 5.0  # a rank failed: the others may wait for it forever
            if now > deadline or (grace is not None and now > grace):
                break
            time.sleep(0.02)
    finally:
        killed = [rank for rank, p in enumerate(procs) if p.poll() is None]
        for rank in killed:
            os.killpg(procs[rank].pid, signal.SIGKILL)
            procs[rank].wait()
        for log in logs:
            log.close()
    failures = []  # (a consequence of another's failure, when, rank, one line, details)
    for rank, p in enumerate(procs):
        error = os.path.join(workdir, f"rank{rank}.error")
        when = ended.get(rank, float("inf"))
        if os.path.exists(error):
            with open(error) as f:
                trace = f.read().rstrip()
            last = trace.splitlines()[-1]
            lost = any(s in last for s in ("closed by peer", "reset by peer", "Broken pipe"))
            failures.append((lost, when, rank, f"rank {rank} raised {last}", trace))
        elif rank in killed:
            why = "did not exit" if grace is None else "was still running after another rank failed"
            failures.append(
                (True, when, rank, f"rank {rank} {why} within {timeout:g} s: killed", "")
            )
        elif p.returncode != 0:
            code = p.returncode
            name = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            done = os.path.exists(os.path.join(workdir, f"rank{rank}.result"))
            after = " after its work was done (at teardown)" if done else ""
            failures.append((False, when, rank, f"rank {rank} ended with {name}{after}", ""))
    if failures:
        failures.sort()  # a rank that lost its peer, or hung, comes after the rank it lost
        _, _, first, line, details = failures[0]
        lines = [line] + [f"then {other}" for _, _, _, other, _ in failures[1:]]
        with open(os.path.join(workdir, f"rank{first}.log")) as f:
            output = f.read()[-2000:].rstrip()
        lines += [f"--- rank {first}'s traceback:\n{details}"] if details else []
        lines += [f"--- rank {first}'s output (end):\n{output}"] if output else []
        lines.append(f"(every rank's files: {workdir})")
        raise RankFailed("\n".join(lines))
    results = []
    for rank in range(world_size):
        with open(os.path.join(workdir, f"rank{rank}.result"), "rb") as f:
            results.append(pickle.load(f))
    shutil.rmtree(workdir, ignore_errors=True)
    return results


def _rank_process() -> None:
    """One rank of :func:`spawn_ranks` (``python -c``; argv: workdir, rank, world size,
    timeout): join the group, run the function, write its result, leave."""
    import datetime
    import traceback

    workdir, rank, world_size, timeout = sys.argv[1:5]
    rank, world_size, timeout = int(rank), int(world_size), float(timeout)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        with open(os.path.join(workdir, "job.pkl"), "rb") as f:
            fn, args = pickle.load(f)
        dist.init_process_group(
            "gloo",
            init_method="file://" + os.path.join(workdir, "group"),
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout),
        )
        result = fn(rank, world_size, *args)
        with open(os.path.join(workdir, f"rank{rank}.tmp"), "wb") as f:
            pickle.dump(result, f)
        done = os.path.join(workdir, f"rank{rank}")
        os.replace(done + ".tmp", done + ".result")
        dist.barrier()  # every rank is done with the group before any tears it down
        dist.destroy_process_group()
    except BaseException:
        with open(os.path.join(workdir, f"rank{rank}.error"), "w") as f:
            f.write(traceback.format_exc())
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
