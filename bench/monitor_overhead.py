"""How much a monitor slows the local store and a distributed run, side by side.

    python bench/monitor_overhead.py [--rounds 20] [--seconds 0.25] [--warmup 0.1]
    python bench/monitor_overhead.py --cluster [--rounds 6] [--steps 200]
        [--workers 2] [--cluster-keys 0]
    python bench/monitor_overhead.py --inprocess [--ranks 16 64] [--keys 500] [--blocks 3]

``--inprocess``: W ranks (16 and 64) on S = 4 real servers in this process
(``bench/_watched_cluster.py``: every message pickled as Dask would; the
servers' and ranks' event batches delivered to a notebook-side bus), each
round a push and a pull of every one of K = 500 tiny keys by every rank. In
blocks of rounds alternating in a rotating order: unwatched, ``monitor(kv)``
(its model), and ``monitor(kv)`` with its dashboard built and refreshed (as a
displayed one is, no browser); each block's first round is untimed (a monitor
is made for each block, and lives as long as its notebook: its start, the
streams starting and the first drawing of every view, is not a round's cost).
Printed: seconds (and this process's CPU
seconds) per round, the median [range] of each watched block's ratio to the
median unwatched block (the CPU ratio reads steadier on a shared machine: a
neighbour's load stretches wall time more than CPU time), and whether the
watched blocks' per-key counts were exact (W pushes and W pulls per key and
round).

``--cluster``: a distributed run (W = 2 ranks, ``labkv.cluster.run`` on an
embedded 2-worker LocalCluster, S = 2 servers shared with the notebook's store)
of a small MLP's training step: 4 keys (two 64x64 weights, two biases), each
step a push of every gradient and a pull of every weight. Each round runs it
unwatched and with ``monitor(kv)`` subscribed to the notebook's store (the
ranks' and servers' events then travel to the notebook), in alternating
order; printed: seconds per step, and the median [range] of each round's
watched / unwatched ratio.

The local store's conditions:
Conditions, measured in interleaved rounds on one store, so that a noisy
neighbour on a shared machine hurts every condition alike (many short rounds:
the median of the per-round ratios is the steadiest reading here):

- ``no subscriber``: the store builds no events (the baseline);
- ``no-op subscriber``: the store builds every event, nobody does anything
  with it (what any watcher costs the store itself);
- ``counts only``: a subscriber that wants no detail (``detail_interval``
  of an hour): after a key's first call every call is only counted, inline by
  the store (what the exact counts of a throttled watcher cost by themselves);
- ``monitor (model)``: ``monitor(kv)`` with no front end;
- ``monitor + dashboard``: the widgets built and refreshed by the ticker
  thread (at most 10 Hz, spaced out to its CPU share while the store is
  busy; no browser attached, the comm messages go nowhere); the CPU time of
  each refresh is printed too;
- ``after close``: the same store once the monitor is closed (must be 0%).

Garbage is collected before each timed case, so that the events the no-op
subscriber leaves behind are not collected inside another condition's timing,
and every condition runs ``--warmup`` seconds untimed first: a monitor lives
as long as its notebook, so its first ticks (drawing every table from
scratch) are not what a training loop pays.

Each condition's slowdown against ``no subscriber`` is printed two ways: from
the best rates of all rounds, and as the median (and range) of the ratios
within each round. The conditions run in a shuffled order in every round, so
none always follows another's garbage or warms up after it. ``after close``
should read 0%: how far it strays shows the noise of the run. The last lines
of each case divide out what the store spends building events for any
subscriber, leaving the monitor's own share.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
import timeit
from collections.abc import Callable

import numpy as np

import labkv
from labkv.events import summarize
from labkv.widgets import monitor
from labkv.widgets._monitor import DETAIL_BURST, DETAIL_INTERVAL

Setup = Callable[[object], Callable[[], None]]


def _none(kv) -> Callable[[], None]:
    return lambda: None


def _noop(kv) -> Callable[[], None]:
    return kv.events.subscribe(lambda e: None).unsubscribe


def _counts_only(kv) -> Callable[[], None]:
    return kv.events.subscribe(lambda e: None, detail_interval=3600.0).unsubscribe


def _model(kv) -> Callable[[], None]:
    return monitor(kv).close


#: CPU seconds of each dashboard refresh (the refresh thread's own time)
REFRESH_CPU: list[float] = []


def _dashboard(kv) -> Callable[[], None]:
    mon = monitor(kv)
    _ = mon.widget  # builds the widgets and starts the 10 Hz refresh thread
    refresh = mon.refresh

    def timed() -> None:
        start = time.thread_time()
        refresh()
        REFRESH_CPU.append(time.thread_time() - start)

    mon._ticker.fn = timed  # what the refresh thread calls, timed in its own CPU time
    return mon.close


def _closed(kv) -> Callable[[], None]:
    mon = monitor(kv)
    _ = mon.widget
    mon.close()
    return lambda: None


CONDITIONS: dict[str, Setup] = {
    "no subscriber": _none,
    "no-op subscriber": _noop,
    "counts only": _counts_only,
    "monitor (model)": _model,
    "monitor + dashboard": _dashboard,
    "after close": _closed,
}


def push_pull_rate(kv, key, value, out, seconds: float) -> float:
    """push+pull pairs per second over about ``seconds``."""
    n, t0 = 0, time.perf_counter()
    deadline = t0 + seconds
    while True:
        for _ in range(20):
            kv.push(key, value)
            kv.pull(key, out=out)
        n += 20
        now = time.perf_counter()
        if now >= deadline:
            return n / (now - t0)


def _slower(ratio: float) -> str:
    return f"{(1 - ratio) * 100:+5.1f}%"


MLP = {"w1": (64, 64), "b1": (64,), "w2": (64, 64), "b2": (64,)}


def _mlp_steps(kv, steps: int, shapes: dict | None = None) -> float:
    """One rank's training loop: seconds per step (push every gradient, pull every
    weight); ``shapes``: the keys and their shapes (the MLP's by default)."""
    shapes = MLP if shapes is None else shapes
    keys = list(shapes)
    grads = [np.full(shapes[k], 0.01, np.float32) for k in keys]
    outs = [np.empty(shapes[k], np.float32) for k in keys]
    for _ in range(5):
        kv.push(keys, grads)
        kv.pull(keys, out=outs)
    kv.barrier()
    t = time.perf_counter()
    for _ in range(steps):
        kv.push(keys, grads)
        kv.pull(keys, out=outs)
    elapsed = (time.perf_counter() - t) / steps
    kv.barrier()
    return elapsed


def cluster_main(rounds: int, steps: int, workers: int = 2, keys: int = 0) -> None:
    from labkv.cluster import connect, run

    # keys > 0: that many tiny keys (4 floats) instead of the MLP's four
    shapes = MLP if not keys else {f"k{i}": (4,) for i in range(keys)}
    with connect(n_workers=workers, dashboard_address=None) as handle:
        kv = labkv.create("dist_sync", cluster=handle, num_servers=2)
        kv.init(list(shapes), [np.zeros(shape, np.float32) for shape in shapes.values()])
        kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.1))
        watchers = {
            "unwatched": lambda: None,
            "no-op subscriber": lambda: (
                kv.events.subscribe(
                    lambda event: None, detail_interval=DETAIL_INTERVAL, detail_burst=DETAIL_BURST
                ).unsubscribe
            ),
            "watched": lambda: monitor(kv).close,
        }
        times: dict[str, list[float]] = {name: [] for name in watchers}
        ratios: dict[str, list[float]] = {name: [] for name in watchers}
        order = list(watchers)
        for _ in range(rounds):
            random.shuffle(order)
            this = {}
            for name in order:
                stop = watchers[name]()
                try:
                    per_rank = run(
                        _mlp_steps, num_workers=workers, kvstore=kv, args=(steps, shapes)
                    )
                finally:
                    if stop is not None:
                        stop()
                this[name] = max(per_rank)
                times[name].append(this[name])
            for name in watchers:
                ratios[name].append(this[name] / this["unwatched"])
        kv.close()
    print(f"labkv monitor overhead on a distributed run: {rounds} rounds x {steps} steps,")
    what = "an MLP's 4 keys" if not keys else f"{keys} tiny keys"
    print(f"W = {workers} ranks, S = 2 servers, {what} pushed and pulled per step")
    print('("no-op subscriber": the events travel to the notebook, nobody draws them)')
    for name, ts in times.items():
        r = sorted(ratios[name])
        print(
            f"  {name:<17} {statistics.median(ts) * 1e3:8.3f} ms per step (median);"
            f"  / unwatched per round: median {statistics.median(r):.3f} [{r[0]:.3f} .. {r[-1]:.3f}]"
        )


def inprocess_main(ranks: list[int], keys: int, blocks: int, rounds: int) -> None:
    import ipywidgets
    from _watched_cluster import WatchedCluster

    print(f"labkv monitor overhead, in-process dist_sync: S = 4 servers, {keys} tiny keys,")
    print(
        f"each round every rank pushes and pulls every key; {blocks} x 3 blocks of {rounds} rounds"
    )
    for workers in ranks:
        cluster = WatchedCluster(workers, 4, keys)
        cluster.rounds(1)  # warm-up: every key's first round
        times: dict[str, list[float]] = {name: [] for name in ("unwatched", "model", "dashboard")}
        cpu: dict[str, list[float]] = {name: [] for name in times}
        exact = True
        refreshes: list[float] = []
        order = list(times)
        for block in range(blocks * len(order)):
            name = order[(block + block // len(order)) % len(order)]
            mon = None if name == "unwatched" else monitor(cluster.kv)
            if name == "dashboard":
                _ = mon.widget  # built and refreshed by its thread, as when displayed
                mon._ticker.fn = _timed_refresh(mon.refresh, refreshes)
            try:
                # A monitor lives as long as its notebook: its first round (the
                # streams starting, the first drawing of every view) is untimed,
                # and so is the unwatched block's, alike.
                cluster.rounds(1)
                times[name].append(cluster.rounds(rounds))
                cpu[name].append(cluster.cpu)
            finally:
                if mon is not None:
                    exact &= _counts_exact(mon, cluster, rounds + 1)
                    mon.close()
                if name == "dashboard":
                    # A closed monitor's widgets stay displayed (and in memory) as a
                    # notebook's do; a notebook has one, not one per block: the heap
                    # of old ones would make every later block's collector slower.
                    ipywidgets.Widget.close_all()
        cluster.close()
        base, base_cpu = statistics.median(times["unwatched"]), statistics.median(cpu["unwatched"])
        print(
            f"\nW = {workers}: unwatched {base * 1e3:7.1f} ms per round, "
            f"{base_cpu * 1e3:7.1f} ms CPU (medians)"
        )
        for name in ("model", "dashboard"):
            r = sorted(t / base for t in times[name])
            c = sorted(t / base_cpu for t in cpu[name])
            print(
                f"  {name:<10} {statistics.median(times[name]) * 1e3:7.1f} ms per round:"
                f" / unwatched {statistics.median(r):.2f} [{r[0]:.2f} .. {r[-1]:.2f}];"
                f" CPU {statistics.median(c):.2f} [{c[0]:.2f} .. {c[-1]:.2f}]"
            )
        print(f"  per-key counts exact in every watched block: {'yes' if exact else 'NO'}")
        if refreshes:
            ms = sorted(t * 1e3 for t in refreshes)
            print(
                f"  dashboard refreshes: {len(ms)}, CPU median {ms[len(ms) // 2]:.1f} ms"
                f" [{ms[0]:.1f} .. {ms[-1]:.1f}] each"
            )
    _event_costs(keys)


def _timed_refresh(refresh, cpu: list[float]):
    """``refresh``, its thread CPU time appended to ``cpu`` (what the ticker calls)."""

    def timed() -> None:
        start = time.thread_time()
        refresh()
        cpu.append(time.thread_time() - start)

    return timed


def _event_costs(keys: int) -> None:
    """What one event costs where it is made and where it is folded (best of 5)."""
    from labkv.cluster._event_relay import ClusterBus, EventStream, pack_batch
    from labkv.events import EventBus
    from labkv.widgets import MonitorModel

    names = list(range(keys))
    value = np.ones(4, np.float32)
    sizes = [16] * keys

    def best(fn, number: int) -> float:
        return min(timeit.repeat(fn, number=number, repeat=5)) / number

    source = EventBus("dist_sync-cost")
    stream = EventStream(source, lambda batch: None)
    source.op_budget = 1
    source.subscribe(stream._collect, detail_interval=DETAIL_INTERVAL, detail_burst=DETAIL_BURST)
    source.count_keys("pull", names, sizes)  # the budget used up: every call only counted

    def counted_call() -> None:  # counted, then sent at a flush as one record
        source.count_keys("pull", names, sizes)
        source.flush()
        stream.buffer.clear()

    counted = best(counted_call, 20) / keys

    def detailed() -> None:
        source.emit("pull", 1, value, rank=3, count=1, nbytes=16, extra={"start": 0.0})

    made = best(detailed, 2000)
    batch = pack_batch(stream.buffer[:500])
    stream.buffer.clear()
    model, bus = MonitorModel(max_pending=10**9), ClusterBus("dist_sync-cost")
    bus.subscribe(model.on_event)

    def received() -> None:
        bus.receive((0.0, batch))
        model.flush()

    folded = best(received, 20) / 500
    for _ in range(3):
        source.count_keys("pull", names, sizes)
    source.flush()
    record = pack_batch(stream.buffer[-1:])
    per_key = best(lambda: (bus.receive((0.0, record)), model.flush()), 50) / keys
    print(f"\ncost per event (best of 5), {keys} keys:")
    print(f"  a key of a watched call only counted, and flushed:  {counted * 1e6:6.2f} us")
    print(f"  a detailed event made and collected by its stream:  {made * 1e6:6.2f} us")
    print(f"  a detailed event received and folded (notebook):    {folded * 1e6:6.2f} us")
    print(f"  a key of a counted-calls record received and folded: {per_key * 1e6:6.2f} us")


def _counts_exact(mon, cluster, rounds: int) -> bool:
    """Whether the monitor counted every push and pull of every key (the batches
    still travelling arrive within a few flush intervals)."""
    want = cluster.workers * rounds
    deadline = time.monotonic() + 5.0
    while True:
        mon.refresh()
        stats = mon.model.keys
        got = [(stats[k].pushes, stats[k].pulls) if k in stats else (0, 0) for k in cluster.keys]
        if all(g == (want, want) for g in got) or time.monotonic() > deadline:
            return all(g == (want, want) for g in got)
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=0.25)
    parser.add_argument("--warmup", type=float, default=0.1)
    parser.add_argument("--cluster", action="store_true")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2, help="--cluster: ranks (workers)")
    parser.add_argument("--cluster-keys", type=int, default=0, help="--cluster: tiny keys")
    parser.add_argument("--inprocess", action="store_true")
    parser.add_argument("--ranks", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--blocks", type=int, default=3)
    args = parser.parse_args()
    if args.inprocess:
        inprocess_main(args.ranks, args.keys, args.blocks, args.rounds or 3)
        return
    if args.cluster:
        cluster_main(args.rounds or 6, args.steps, args.workers, args.cluster_keys)
        return
    args.rounds = args.rounds or 20
    kv = labkv.create("local")
    cases = {
        "tiny (4 x float32)": ("tiny", np.ones(4, np.float32)),
        "1 MiB (float32)": ("big", np.ones(2**18, np.float32)),
    }
    for key, value in cases.values():
        kv.init(key, np.zeros_like(value))
    rates: dict[tuple[str, str], list[float]] = {}
    order = list(CONDITIONS)
    shuffle = random.Random(0).shuffle
    for _ in range(args.rounds):
        shuffle(order)  # no condition always runs right after the no-op subscriber's garbage
        for name in order:
            teardown = CONDITIONS[name](kv)
            try:
                for case, (key, value) in cases.items():
                    out = np.empty_like(value)
                    # The no-op subscriber leaves ~100,000 events of garbage: collect it
                    # here, not in whichever condition the collector would wake up in.
                    gc.collect()
                    push_pull_rate(kv, key, value, out, args.warmup)  # steady state first
                    rate = push_pull_rate(kv, key, value, out, args.seconds)
                    rates.setdefault((case, name), []).append(rate)
            finally:
                teardown()
    print(f"labkv monitor overhead: {args.rounds} rounds x {args.seconds} s, local store")
    print("(best: ratio of the best rates; per round: median [range] of each round's ratio)")
    for case in cases:
        print(f"\n{case}: push+pull pairs per second")
        base = rates[case, "no subscriber"]
        for name in CONDITIONS:
            best = max(rates[case, name]) / max(base)
            paired = sorted(r / b for r, b in zip(rates[case, name], base, strict=True))
            print(
                f"  {name:<20} {max(rates[case, name]):9,.0f} /s   best {_slower(best)}"
                f"   per round {_slower(statistics.median(paired))}"
                f" [{_slower(paired[-1])} .. {_slower(paired[0])}]"
            )
        events = max(rates[case, "no-op subscriber"])
        for name in ("monitor (model)", "monitor + dashboard"):
            own = max(rates[case, name]) / events
            print(f"  the monitor's own share, {name} vs no-op subscriber: ratio {own:5.3f}")
    print("\nvalue summary (min/max/mean/norm, built for each detailed event), best of 5:")
    for case, (_, value) in cases.items():
        per_call = min(timeit.repeat(lambda v=value: summarize(v), number=200, repeat=5)) / 200
        print(f"  {case:<20} {per_call * 1e6:8.1f} us")
    if REFRESH_CPU:
        ms = sorted(t * 1e3 for t in REFRESH_CPU)
        print(
            f"\ndashboard refresh while the store is busy: {len(ms)} ticks, CPU per tick "
            f"median {ms[len(ms) // 2]:.2f} ms, mean {sum(ms) / len(ms):.2f} ms"
        )


if __name__ == "__main__":
    main()
