"""Memory of a watched 2-rank run over a soak, against the same run unwatched.

    python bench/soak.py [--seconds=600] [--warmup=120] [--bound=0.5]
        [--history=100] [--only=watched,unwatched,dask] [--probe]

A ``dask scheduler`` and 2 ``dask worker`` processes (CLI, 127.0.0.1), so that
the notebook (this process), the scheduler and each worker are measured apart.
For each condition a fresh cluster runs ``run(train, num_workers=2,
kvstore=kv)`` on a ``dist_sync`` store of 2 servers for ``--seconds``: each
step every rank pushes and pulls 4 small keys and one 1 MiB key (every 100
steps the ranks agree through the store whether time is up, so both run the
same number of steps). Every 30 s each process's resident memory (MiB) is
printed. The conditions:

- ``watched``: ``monitor(kv)`` plus a subscriber counting every event;
- ``unwatched``: no subscriber;
- ``watched, Dask's profile history`` (``dask``): as ``watched``, with Dask's own
  ``distributed.admin.low-level-log-length`` (1000) on the workers.

Why the third: a Dask worker's statistical profiler samples every thread
that runs a task (a rank is one long task) every 10 ms, and keeps one tree of
the sampled stacks per second for the last ``low-level-log-length`` seconds
(``Worker.profile_history`` and ``profile_keys_history``). A watched rank runs
many distinct stacks, so those trees grow the worker by about 5 MiB a minute
for the first 1000 s (about 17 minutes), then stop. That is Dask's memory, not
labkv's: the first two conditions keep ``--history`` seconds of it (100 by
default, less than the warm-up), so that what grows after the warm-up is
what labkv holds.

The bound: after ``--warmup`` seconds, the least-squares slope of each
worker's RSS in the first two conditions must stay under ``--bound``
MiB/min; printed as ``PASS``/``FAIL`` with the numbers (the third condition's
slope is printed, not bounded). A benchmark, not a test: it prints, it
asserts nothing (its exit status is 1 when a bound fails, for scripts).

``--probe``: at the warm-up's end and at the run's end each worker counts its
live objects by type (``gc.get_objects()``; dicts also by their first keys)
and the sizes of Dask's logs (the profile history, the batched stream's
``recent_message_log``, the worker state's logs); the types that grew most are
printed. Each condition ends by closing the monitor and the store, and
prints each process's RSS 10 s later and the event batches of the store left
on the scheduler.
"""

from __future__ import annotations

import collections
import gc
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import labkv  # noqa: E402
from labkv.cluster import connect, run  # noqa: E402
from labkv.cluster._event_relay import topic_of  # noqa: E402
from labkv.widgets import monitor  # noqa: E402
from tests._cli import Procs, start_scheduler, start_worker  # noqa: E402

NAMES = ["a", "b", "c", "d", "big"]
DASK_DEFAULTS = "watched, Dask's profile history"
#: ``--only``'s names of the conditions
CONDITIONS = {"watched": "watched", "unwatched": "unwatched", "dask": DASK_DEFAULTS}
SAMPLE_S = 30.0
CHECK_EVERY = 100  # steps between the ranks' agreement on whether time is up


def _rss(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def _topics(dask_scheduler=None):
    return {t: len(topic.events) for t, topic in dask_scheduler._broker._topics.items()}


def _train(kv, deadline: float) -> int:
    """Push and pull every key each step until ``deadline`` (this machine's
    wall clock, shared by the ranks); returns the steps made."""
    values = [np.ones(16, np.float32)] * 4 + [np.ones(1 << 18, np.float32)]
    outs = [np.empty_like(v) for v in values]
    go = np.empty(1, np.float32)
    steps = 0
    while True:
        kv.push(NAMES, values)
        kv.pull(NAMES, out=outs)
        steps += 1
        if steps % CHECK_EVERY == 0:
            # dist_sync without an optimizer stores the ranks' sum: both read the same answer
            kv.push("go", np.full(1, float(time.time() < deadline), np.float32))
            kv.pull("go", out=go)
            if go[0] < kv.num_workers:
                return steps


def _census(dask_worker=None) -> dict:
    """Live objects by type, and the sizes of Dask's message logs on this worker."""
    gc.collect()
    objects = gc.get_objects()
    counts = collections.Counter(type(o).__qualname__ for o in objects)
    # dicts by their keys: which records they are
    counts.update("dict" + str(sorted(map(str, o))[:6]) for o in objects if type(o) is dict)
    logs = {"profile_history": len(dask_worker.profile_history)}
    state = getattr(dask_worker, "state", None)
    for name, holder in (("state.log", state), ("state.stimulus_log", state)):
        held = getattr(holder, name.split(".")[1], None)
        if held is not None:
            logs[name] = len(held)
    stream = dask_worker.batched_stream
    if stream is not None:
        log = stream.recent_message_log
        logs["batched recent_message_log"] = len(log)
        logs["  its bytes held (MiB)"] = round(_held_bytes(log) / 2**20, 1)
    return {"types": dict(counts), "logs": logs}


def _held_bytes(log) -> int:
    """The bytes and buffers held by the messages in a batched stream's log."""
    total, todo = 0, list(log)
    while todo:
        item = todo.pop()
        if isinstance(item, bytes | bytearray | memoryview):
            total += len(item)
        elif isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, list | tuple):
            todo.extend(item)
    return total


def _slope(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of ``(seconds, MiB)`` samples, in MiB/min."""
    t = np.array([s[0] for s in samples])
    m = np.array([s[1] for s in samples])
    if len(t) < 2:
        return float("nan")
    return float(np.polyfit(t / 60.0, m, 1)[0])


def _print_census(before: dict, after: dict) -> None:
    for worker in before:
        b, a = before[worker], after[worker]
        print(f"  {worker}: {a['logs']}")
        grown = collections.Counter(a["types"])
        grown.subtract(b["types"])
        top = [(t, n) for t, n in grown.most_common(8) if n > 0]
        print("    grown types: " + (", ".join(f"{t} +{n}" for t, n in top) or "none"))


def soak(
    label: str,
    seconds: float,
    warmup: float,
    history: int,
    probe: bool = False,
) -> dict[str, list]:
    """One condition on a fresh cluster: each process's ``(seconds, MiB)``
    samples. ``history``: the workers' ``distributed.admin.low-level-log-length``
    (0: Dask's own, 1000)."""
    watched = label.startswith("watched")
    tmp = Path(tempfile.mkdtemp())
    procs = Procs(tmp)
    env = dict(os.environ)
    if history:
        env["DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH"] = str(history)
    try:
        address = start_scheduler(procs, tmp)
        start_worker(procs, "w", address, tmp, nworkers=2, env=env)
        with connect(address, n_workers=2) as handle:
            workers = handle.client.run(lambda: __import__("os").getpid())
            pids = {"notebook": psutil.Process().pid, "scheduler": procs.procs[0].pid}
            pids.update({f"worker {i}": pid for i, pid in enumerate(workers.values())})
            samples: dict[str, list] = {name: [] for name in pids}
            start = time.monotonic()

            def row(when: str) -> None:
                now = time.monotonic() - start
                cells = []
                for name, pid in pids.items():
                    mib = _rss(pid)
                    samples[name].append((now, mib))
                    cells.append(f"{mib:9.1f}")
                print(f"{when:>14}  " + "  ".join(cells), flush=True)

            kept = f"{history} s" if history else "Dask's default, 1000 s"
            print(f"\n== {label}, {seconds:.0f} s; the workers' profile history: {kept} ==")
            print(f"{'':>14}  " + "  ".join(f"{n:>9}" for n in pids))
            kv = labkv.create("dist_sync", cluster=handle, num_servers=2)
            values = [np.zeros(16, np.float32)] * 4 + [np.zeros(1 << 18, np.float32)]
            kv.init(NAMES + ["go"], values + [np.zeros(1, np.float32)])
            seen = [0]
            watchers = []
            if watched:
                watchers.append(monitor(kv))
                watchers.append(kv.events.subscribe(lambda e: seen.__setitem__(0, seen[0] + 1)))
            row("0 s")
            done = threading.Event()
            census: dict[str, dict] = {}

            def sampler() -> None:
                while not done.wait(SAMPLE_S - (time.monotonic() - start) % SAMPLE_S):
                    row(f"{time.monotonic() - start:5.0f} s")
                    if probe and "warm" not in census and time.monotonic() - start >= warmup:
                        census["warm"] = handle.client.run(_census)

            thread = threading.Thread(target=sampler, daemon=True)
            thread.start()
            steps = run(_train, num_workers=2, kvstore=kv, args=(time.time() + seconds,))
            done.set()
            thread.join()
            row(f"{time.monotonic() - start:5.0f} s")
            if probe and "warm" in census:
                print("census, from the warm-up's end to the run's end:")
                _print_census(census["warm"], handle.client.run(_census))
            held = handle.client.run_on_scheduler(_topics).get(topic_of(kv.store_id))
            print(
                f"{steps} steps per rank; {seen[0]} events delivered; the scheduler held "
                f"{held} event batches of the store"
            )
            topic = topic_of(kv.store_id)
            for w in watchers:
                (w.close if hasattr(w, "close") else w.unsubscribe)()
            kv.close()
            del kv, watchers
            gc.collect()
            time.sleep(10)
            print(f"{'closed + 10 s':>14}  " + "  ".join(f"{_rss(p):9.1f}" for p in pids.values()))
            left = handle.client.run_on_scheduler(_topics).get(topic)
            print(f"event batches of the store left on the scheduler: {left}")
        return samples
    finally:
        procs.stop()


def report(results: dict[str, dict[str, list]], warmup: float, bound: float) -> bool:
    ok = True
    print(
        f"\nRSS after {warmup:.0f} s of warm-up: first -> last (MiB), least-squares slope "
        f"(MiB/min); bound for each worker: < {bound} MiB/min"
    )
    for label, samples in results.items():
        for name, series in samples.items():
            after = [s for s in series if s[0] >= warmup]
            if len(after) < 2:
                print(f"  {label:>31} {name:>9}: too few samples after the warm-up")
                ok = ok and not (name.startswith("worker") and label != DASK_DEFAULTS)
                continue
            slope = _slope(after)
            verdict = ""
            if name.startswith("worker") and label != DASK_DEFAULTS:
                passed = slope < bound
                ok = ok and passed
                verdict = "PASS" if passed else "FAIL"
            print(
                f"  {label:>31} {name:>9}: {after[0][1]:6.1f} -> {after[-1][1]:6.1f}"
                f"  slope {slope:+6.3f} MiB/min  {verdict}"
            )
    print("bound " + ("PASS" if ok else "FAIL"))
    return ok


def main(argv: list[str]) -> int:
    opts = {
        "seconds": 600.0,
        "warmup": 120.0,
        "bound": 0.5,
        "history": 100,
        "only": "",
        "probe": False,
    }
    for arg in argv:
        name, _, value = arg.removeprefix("--").partition("=")
        if name not in opts:
            raise SystemExit(f"unknown option {arg!r}; see the docstring")
        opts[name] = True if name == "probe" else type(opts[name])(value)
    only = opts["only"].split(",") if opts["only"] else list(CONDITIONS)
    if not set(only) <= set(CONDITIONS):
        raise SystemExit(f"--only takes some of {list(CONDITIONS)}, comma-separated")
    conditions = [CONDITIONS[name] for name in only]
    results = {}
    for c in conditions:
        history = 0 if c == DASK_DEFAULTS else opts["history"]
        results[c] = soak(c, opts["seconds"], opts["warmup"], history, opts["probe"])
    return 0 if report(results, opts["warmup"], opts["bound"]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
