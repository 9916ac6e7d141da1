"""Events: what each call reports, at no cost when nobody listens."""

from __future__ import annotations

import collections
import random
import threading

import numpy as np
import pytest

import labkv
from labkv.events import COMPACT_AT, Event, EventBus, compact_rows, summarize
from labkv.events._tally import Columns, Tallies


def test_each_call_reports_its_events_in_order():
    kv = labkv.create()
    seen: list[Event] = []
    with kv.events.subscribe(seen.append):
        kv.init(3, np.full((2, 3), 2.0, np.float32))
        devices = labkv.devices(4)
        kv.push(3, [labkv.ones((2, 3), device=d) for d in devices])
        kv.set_updater(lambda key, merged, stored: stored.__iadd__(merged * 2))
        kv.push(3, labkv.ones((2, 3)))
        kv.pull(3, out=[labkv.zeros((2, 3), device=d) for d in devices[:2]])
    kv.push(3, labkv.ones((2, 3)))  # after unsubscribing: not seen
    assert [e.op for e in seen] == ["init", "push", "push", "update", "pull"]
    init, push4, push1, update, pull = seen
    assert init.key == 3 and init.shape == (2, 3) and init.dtype == "float32"
    assert init.summary == {"min": 2.0, "max": 2.0, "mean": 2.0, "norm": pytest.approx(2 * 6**0.5)}
    assert push4.devices == ("cpu(0)", "cpu(1)", "cpu(2)", "cpu(3)")
    assert push4.nbytes == 4 * 24 and push4.summary["mean"] == 4.0
    assert len(push4.extra["per_device"]) == 4
    assert update.before["mean"] == 4.0 and update.after["mean"] == 6.0
    assert update.summary["mean"] == 1.0  # the merged input
    assert pull.devices == ("cpu(0)", "cpu(1)") and pull.summary["mean"] == 6.0
    assert [e.seq for e in seen] == sorted(e.seq for e in seen)
    assert all(e.store == kv.events.store_id for e in seen)


def test_optimizer_steps_are_reported_with_before_and_after():
    kv = labkv.create()
    kv.init("w", np.zeros(2, np.float32))
    kv.set_optimizer("sgd", learning_rate=0.5)
    kv.events.record()
    kv.push("w", [np.ones(2, np.float32)] * 2)
    ops = [e.op for e in kv.events.recent()]
    assert ops == ["push", "optimizer"]
    step = kv.events.recent()[1]
    assert step.before["mean"] == 0.0 and step.after["mean"] == -1.0
    assert step.extra["optimizer"] == "sgd"


def test_nothing_is_built_without_a_listener(monkeypatch):
    kv = labkv.create()
    kv.init(0, np.zeros(2))
    assert kv.events.active is False

    def fail(*args, **kwargs):
        raise AssertionError("an event was built with nobody listening")

    monkeypatch.setattr(kv.events, "emit", fail)
    monkeypatch.setattr(labkv.events, "summarize", fail)
    kv.push(0, np.ones(2))
    kv.pull(0)
    assert kv.events.recent() == []


def test_ring_is_bounded_and_unsubscribe_stops_delivery():
    bus = EventBus("s", ring_size=5)
    got = []
    handle = bus.subscribe(got.append)
    for i in range(12):
        bus.emit("push", i)
    assert [e.key for e in bus.recent()] == [7, 8, 9, 10, 11]
    assert [e.key for e in bus.recent(2)] == [10, 11]
    handle.unsubscribe()
    handle.unsubscribe()  # idempotent
    assert not bus.active
    bus.emit("push", 99)
    assert len(got) == 12


def test_events_round_trip_through_plain_data_and_threads():
    bus = EventBus("s")
    got = []
    bus.subscribe(got.append)
    event = Event(1, 0.0, "remote", "push", "w", rank=1, devices=("gpu(0)",), shape=(2,))
    threads = [threading.Thread(target=bus.deliver, args=(event,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4
    assert Event.from_dict(event.to_dict()) == event


def test_summarize_handles_empty_and_integer_arrays():
    assert summarize(np.array([1, 2, 3]))["mean"] == 2.0
    assert summarize(np.zeros(0))["norm"] == 0.0
    with pytest.raises(TypeError):
        EventBus("s").subscribe("not callable")


def test_throttled_counts_stay_exact_under_a_busy_loop_and_concurrent_flushes():
    kv = labkv.create()
    kv.init("k", np.zeros(4, np.float32))
    got: list[Event] = []
    lock = threading.Lock()

    def record(event):
        with lock:
            got.append(event)

    kv.events.subscribe(record, detail_interval=60, detail_burst=2)
    stop = threading.Event()

    def keep_flushing():  # what a monitor's refresh thread does
        while not stop.is_set():
            kv.events.flush()

    flusher = threading.Thread(target=keep_flushing)
    flusher.start()
    one, two = [np.ones(4, np.float32)], [np.ones(4, np.float32)] * 2
    pushes = [one if i % 7 else two for i in range(3000)]  # the shape changes now and then
    try:
        for values in pushes:
            kv.push("k", values)
            kv.pull("k", out=np.empty(4, np.float32))
    finally:
        stop.set()
        flusher.join()
    kv.events.flush()
    pushed = [e for e in got if e.op == "push"]
    pulled = [e for e in got if e.op == "pull"]
    assert sum(e.count for e in pushed) == len(pushes)
    assert sum(e.nbytes for e in pushed) == 16 * sum(len(v) for v in pushes)
    assert sum(e.count for e in pulled) == len(pushes)
    assert sum(e.nbytes for e in pulled) == 16 * len(pushes)
    assert len([e for e in pushed if not e.tally]) == 2  # the detail budget


def test_a_slow_busy_key_still_gets_a_detailed_event_every_window(monkeypatch):
    # Credits are sized by the key's rate: at 1,000 calls/s a 0.2 s window must end
    # about on time (a fixed grant of 1,024 calls would silence it for a second).
    # The bus's clock is stepped 1 ms per call, so a loaded machine cannot slow it.
    import types

    import labkv.events._tally

    now = [1000.0]
    monkeypatch.setattr(
        labkv.events._tally, "time", types.SimpleNamespace(monotonic=lambda: now[0])
    )
    bus = EventBus("s")
    bus.subscribe(lambda e: None, detail_interval=0.2, detail_burst=1)
    detailed = 0
    for _ in range(1000):
        if bus.count("push", "k", 8):  # a store's call of one array: credits are spent inline
            detailed += 1
        now[0] += 0.001
    assert 4 <= detailed <= 6, detailed


def test_a_plain_subscriber_added_to_a_busy_throttled_key_sees_the_next_call():
    kv = labkv.create()
    kv.init("k", np.zeros(4, np.float32))
    throttled: list[Event] = []
    kv.events.subscribe(throttled.append, detail_interval=60, detail_burst=1)
    for _ in range(50):  # the key is busy: its calls are counted inline on credits
        kv.push("k", np.ones(4, np.float32))
    plain: list[Event] = []
    kv.events.subscribe(plain.append)  # wants every call: the credits are taken back
    # the 49 calls only counted so far went to the throttled subscriber as it subscribed
    assert sum(e.count for e in throttled if e.op == "push") == 50
    kv.push("k", np.ones(4, np.float32))
    assert [e.op for e in plain] == ["push"]
    # the new subscriber's event is its own call only: nothing lost, nothing twice
    assert plain[0].count == 1 and plain[0].nbytes == 16
    assert sum(e.count for e in throttled if e.op == "push") == 51


def test_count_is_exact_for_calls_of_one_and_of_many_arrays():
    # Calls of one array spend credits inline, calls of several go through admit():
    # both must end up in the counts, with their bytes, and nothing twice.
    bus = EventBus("s")
    got: list[Event] = []
    bus.subscribe(got.append, detail_interval=60, detail_burst=2)
    calls = [1, 3, 1, 1, 2] * 400
    for n in calls:
        if admitted := bus.count("push", "w", 8, n=n):
            bus.emit("push", "w", nbytes=admitted[1], count=admitted[0])
    bus.flush()
    assert sum(e.count for e in got) == len(calls)
    assert sum(e.nbytes for e in got) == 8 * sum(calls)
    assert [e.tally for e in got] == [False, False, True]  # two in detail, then counted
    assert bus.flush() == 0  # nothing owed twice


def test_tally_and_first_piece_are_fields_that_travel_between_processes():
    event = Event(0, 1.0, "dist_sync", "push", "w", server=1, count=5, tally=True)
    event.first_piece = False
    back = Event.from_dict(event.to_dict())
    assert (back.tally, back.first_piece, back.extra) == (True, False, {})
    assert (Event(0, 1.0, "s", "pull", "w").tally, Event(0, 1.0, "s", "pull", "w").first_piece) == (
        False,
        True,
    )


def test_a_tally_event_summarises_the_stored_value_and_a_store_that_cannot_read_gives_none():
    kv = labkv.create()
    kv.init("w", np.zeros(2))
    got: list[Event] = []
    kv.events.subscribe(got.append, detail_interval=60, detail_burst=1)
    for _ in range(3):
        kv.push("w", np.full(2, 3.0))
    kv.events.flush()
    tally = [e for e in got if e.tally]
    assert [e.count for e in tally] == [2] and tally[0].summary["mean"] == 3.0
    bus = EventBus("s", read=lambda key: None)
    seen: list[Event] = []
    bus.subscribe(seen.append, detail_interval=60)
    bus.count("pull", "w", 8), bus.count("pull", "w", 8)
    bus.flush()
    assert [(e.count, e.summary) for e in seen if e.tally] == [(1, None)]


def test_a_budget_per_op_bounds_the_detail_of_many_keys_with_exact_counts():
    # 500 keys pulled together, each once a "round" (as a rank of a big run does):
    # every key's slot sees one call per window, so only the op's budget bounds the
    # detail. Calls of many keys are counted with one check, concurrently flushed.
    kv = labkv.create()
    keys = list(range(500))
    kv.init(keys, [np.zeros(4, np.float32)] * len(keys))
    got: list[Event] = []
    lock = threading.Lock()

    def record(event):
        with lock:
            got.append(event)

    kv.events.subscribe(record, detail_interval=60, detail_burst=4)
    assert kv.events.op_budget == 4
    stop = threading.Event()

    def keep_flushing():
        while not stop.is_set():
            kv.events.flush()

    flusher = threading.Thread(target=keep_flushing)
    flusher.start()
    outs = [np.empty(4, np.float32) for _ in keys]
    try:
        for _ in range(20):
            kv.pull(keys, out=outs)
    finally:
        stop.set()
        flusher.join()
    kv.events.flush()
    pulled = [e for e in got if e.op == "pull"]
    assert len([e for e in pulled if not e.tally]) == 4 * 4  # burst x budget, of 10,000 calls
    per_key: dict = {}
    for e in pulled:
        for key, count, nbytes, summary in compact_rows(e):
            per_key[key] = per_key.get(key, 0) + count
            assert nbytes == 16 * count
            assert summary is None or summary["mean"] == 0.0
    assert per_key == dict.fromkeys(keys, 20)
    records = [e for e in pulled if e.key is None]
    assert records and all(e.tally and len(e.extra["keys"]) > COMPACT_AT for e in records)


def test_calls_of_many_keys_are_counted_exactly_whichever_way_a_flush_groups_them():
    # A flush of a rank's repeated calls of the same keys takes them as columns
    # (a call may have only the last of the keys: what is left of it once its
    # first keys got detailed events); other keys, other orders, repeated keys
    # and other bytes go key by key: the counts and bytes must come out the same
    # either way.
    rng = random.Random(7)
    tallies = Tallies()
    tallies.configure(interval=60.0, burst=1)
    calls: collections.Counter = collections.Counter()
    sent: collections.Counter = collections.Counter()
    got: collections.Counter = collections.Counter()
    got_bytes: collections.Counter = collections.Counter()
    columns = 0
    for step in range(300):
        rank = rng.randrange(2)
        pick = rng.random()
        if pick < 0.5:
            keys = list(range(20))
        elif pick < 0.7:
            keys = list(range(rng.randrange(20), 20))
        else:
            keys = rng.choices(range(20), k=12)
        nbytes = [8 * (1 + k % 3) * rng.choice((1, 1, 2)) for k in keys]
        for i, counted in [(i, c) for i, *c in tallies.admit_keys("push", keys, nbytes, rank)]:
            got[(keys[i], rank)] += counted[0]
            got_bytes[(keys[i], rank)] += counted[1]
        for key, n in zip(keys, nbytes):
            calls[(key, rank)] += 1
            sent[(key, rank)] += n
        if step % 7 == 6:
            groups = tallies.due_groups()
            columns += sum(isinstance(g, Columns) for g in groups.values())
            for group in groups.values():
                for key, (count, total, by, _) in group.items():
                    got[(key, by)] += count
                    got_bytes[(key, by)] += total
    for (_, key, rank, _), count, total in tallies.due():
        got[(key, rank)] += count
        got_bytes[(key, rank)] += total
    assert columns > 0  # the quick path was taken, and so was the other
    assert got == calls and got_bytes == sent
