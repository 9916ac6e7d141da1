"""Workers SIGKILLed one after another during ``run(..., replicas=2,
on_rank_loss="replace")`` on the embedded cluster: every killed worker comes
back (its nanny restarts it, and the cluster keeps that nanny), and the run
ends bit-identical to an undisturbed one.

Dask's ``SpecCluster`` closes a nanny for good when no worker of its name is
registered ``distributed.deploy.lost-worker-timeout`` after one was removed;
the default 15 s is met on a busy machine (a restart slower than that) or by a
second kill of the same worker just before that moment. The test sets it to
0.5 s, so that every kill meets it: each restart takes longer than that."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import dask
import numpy as np
import pytest

import labkv
from labkv.cluster import connect, run
from tests._same_run import assert_same_run
from tests._waiting import wait_until

pytestmark = pytest.mark.slow  # a real LocalCluster whose workers are killed

KEYS = ["w", "big"]  # "big" is sliced over both servers
SIZES = {"w": 5, "big": 1200}
STEPS = 30
KILLS = 6
LEG = 4  # the steps the ranks run after each kill
WORKERS = 4  # 2 ranks, 2 servers x 2 replicas, and room for the replacements


def train(kv, gate, progress):
    """SGD with momentum on the servers; each step waits until the number in
    ``gate`` is above it, and writes its index to ``progress``-rank when done.
    The final values and the optimizer states."""
    kv.init(KEYS, [np.zeros(SIZES[k], np.float32) for k in KEYS])
    kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.05, momentum=0.9, wd=0.01))
    kv.barrier()
    outs = [np.zeros(SIZES[k], np.float32) for k in KEYS]
    for step in kv.steps(STEPS):
        while int(Path(gate).read_text() or 0) <= step.index:
            time.sleep(0.02)
        kv.pull(KEYS, out=outs)
        for i, key in enumerate(KEYS):
            noise = step.rng.standard_normal(SIZES[key]).astype(np.float32)
            kv.push(key, 0.1 * outs[i] + noise * (kv.rank + 1 + i))
        with open(f"{progress}-{kv.rank}", "w") as f:
            f.write(str(step.index))
    kv.pull(KEYS, out=outs)
    return outs, kv._optimizer_states()


def _seeded_replicas(dask_worker=None):
    """``(store id, server id)`` of each seeded server replica on this worker."""
    found = []
    for key, actor in list(dask_worker.state.actors.items()):
        match = re.match(r"labkv-server-(.+)-(\d+)(-r\d+)?$", str(key))
        if match and getattr(actor.log, "seeded", True):
            found.append((match.group(1), int(match.group(2))))
    return found


def _rank_workers(client):
    return sorted(
        w for w, keys in client.processing().items() if any("labkv-rank-" in str(k) for k in keys)
    )


def test_workers_killed_one_after_another_all_come_back_and_the_run_is_unchanged(tmp_path):
    # Read by the cluster at each worker's removal: set for the whole test.
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "0.5s"}):
        _kill_one_after_another(tmp_path)


def _kill_one_after_another(tmp_path):
    gate, progress = tmp_path / "gate", tmp_path / "progress"
    handle = connect(
        n_workers=WORKERS, dashboard_address=None, memory_limit="1GiB", set_as_default=False
    )
    try:
        client = handle.client
        opts = dict(num_workers=2, cluster=handle, num_servers=2, replicas=2, timeout=60)
        opts.update(bigarray_bound=1000, args=(str(gate), str(progress)))
        gate.write_text(str(STEPS))
        want = run(train, **opts)
        before = {store for found in client.run(_seeded_replicas).values() for store, _ in found}

        def healed():
            """Every worker back, both ranks running, and each server of the run
            with two seeded replicas on live workers (the next kill then loses
            one of them, not the last)."""
            live = handle.workers()
            if len(live) < WORKERS or len(_rank_workers(client)) < 2:
                return False
            found = client.run(_seeded_replicas, workers=live, on_error="return")
            pieces = [p for f in found.values() if isinstance(f, list) for p in f]
            counts = Counter(sid for store, sid in pieces if store not in before)
            return counts == {0: 2, 1: 2}

        def reached(index):
            for rank in (0, 1):
                path = tmp_path / f"progress-{rank}"
                if not path.exists() or int(path.read_text() or -1) < index:
                    return False
            return True

        gate.write_text("2")
        outcome = {}

        def disturbed():
            try:
                outcome["result"] = run(train, **opts, on_rank_loss="replace", max_restarts=3)
            except BaseException as exc:
                outcome["error"] = exc

        runner = threading.Thread(target=disturbed, daemon=True)
        runner.start()

        def ended():  # the run's own error, if it ended early, says more than a wait
            assert "error" not in outcome, outcome.get("error")
            return not runner.is_alive()

        for k in range(KILLS):
            assert wait_until(lambda: healed() or ended(), 120), (
                f"not healed before kill {k}: {handle.workers()}"
            )
            assert wait_until(lambda k=k: reached(1 + k * LEG) or ended(), 60), (
                "the ranks did not go on"
            )
            assert runner.is_alive(), "the run ended before its last step"
            ranks = _rank_workers(client)
            # Alternately a worker of servers only and a worker of a rank (and servers).
            pool = [w for w in handle.workers() if (w in ranks) == (k % 2 == 1)]
            victim = pool[k // 2 % len(pool)]
            pid = client.run(os.getpid, workers=[victim])[victim]
            gate.write_text(str(2 + (k + 1) * LEG))  # the ranks go on meanwhile
            os.kill(pid, signal.SIGKILL)
            assert wait_until(lambda v=victim: v not in handle.workers(), 30)
        assert wait_until(healed, 120), (
            f"after {KILLS} kills only {len(handle.workers())} of {WORKERS} workers are back"
        )
        assert sorted(handle.cluster.workers) == list(range(WORKERS))  # every nanny kept
        gate.write_text(str(STEPS))
        runner.join(timeout=180)
        assert "error" not in outcome, outcome.get("error")
        got = outcome["result"]
        for rank in (0, 1):
            assert_same_run(got[rank][0], got[rank][1], want[rank][0], want[rank][1])
    finally:
        handle.close()
