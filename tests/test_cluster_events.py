"""Events from the servers arrive, batched, on the notebook's ``kv.events``."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import labkv
from labkv.cluster import run
from labkv.cluster._event_relay import topic_of
from tests._waiting import wait_until


def _wait_for(events, lock, predicate, deadline_s=30.0):
    """Wait (bounded) until some received event satisfies ``predicate``."""

    def seen():
        with lock:
            return any(predicate(e) for e in events)

    return wait_until(seen, deadline_s, poll=0.05)


def _two_ranks_push(kv):
    kv.init(0, np.zeros(4, dtype=np.float32))
    if kv.rank == 1:  # later than a flush of the servers' events: the open round is sent
        time.sleep(0.5)
    kv.push(0, np.ones(4, dtype=np.float32))
    return kv.pull(0)


def test_server_events_reach_the_notebook_bus(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=1)
    events, lock = [], threading.Lock()

    def record(event):
        with lock:
            events.append(event)

    try:
        kv.init(0, np.zeros(4, dtype=np.float32))
        kv.set_optimizer("sgd", learning_rate=0.5)
        kv.push(0, np.ones(4, dtype=np.float32))  # nobody listens: nothing is sent
        kv.pull(0)
        time.sleep(0.3)  # longer than a flush interval: a stray batch would be there
        assert handle.client.get_events(topic_of(kv.store_id)) == ()
        sub = kv.events.subscribe(record)
        run(_two_ranks_push, num_workers=2, kvstore=kv)
        assert _wait_for(events, lock, lambda e: e.op == "round" and e.extra["complete"])
        assert _wait_for(events, lock, lambda e: e.op == "optimizer" and e.server == 0)
        assert _wait_for(events, lock, lambda e: e.op == "load")
        with lock:
            rounds = [e for e in events if e.op == "round"]
            receipts = [e for e in events if e.op == "push" and e.server == 0]
            load = [e for e in events if e.op == "load"][-1]
        assert {e.rank for e in receipts} == {0, 1}
        first = rounds[0].extra
        assert first["num_workers"] == 2 and not first["complete"]
        assert len(first["pushed"]) == 1 and len(first["missing"]) == 1
        done = [e.extra for e in rounds if e.extra["complete"]][0]
        assert done["pushed"] == [0, 1] and done["missing"] == [] and done["round"] == 1
        assert done["waited_s"] >= 0
        assert load.server == 0 and load.extra["keys"] == 1
        assert load.extra["device"] == kv.placement()[0][0]["device"].split("@")[0]
        assert load.extra["bytes_in"] >= 3 * 16 and load.extra["bytes_held"] == 16
        sub.unsubscribe()
        time.sleep(2.5)  # past the scheduler's second look for a last batch (forget_topic)
        assert handle.client.get_events(topic_of(kv.store_id)) == ()  # the topic is dropped
        kv.push(0, np.ones(4, dtype=np.float32))
        kv.pull(0)
        time.sleep(0.3)
        assert handle.client.get_events(topic_of(kv.store_id)) == ()  # streaming stopped
    finally:
        kv.close()


def test_the_last_subscriber_may_leave_after_the_store_is_closed(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2)
    kv.init(0, np.zeros(4, dtype=np.float32))
    sub = kv.events.subscribe(lambda event: None)
    kv.close()
    sub.unsubscribe()  # the servers are gone: leaving is still quiet
    assert not kv.events.active


def _topics(dask_scheduler=None):
    return list(dask_scheduler._broker._topics)


@pytest.mark.slow
def test_a_closed_or_unwatched_store_leaves_no_events_on_the_scheduler(handle):
    from labkv.widgets import monitor

    for end in ("close", "unwatch"):
        kv = labkv.create("dist_sync", cluster=handle, num_servers=2)
        topic = topic_of(kv.store_id)
        mon = monitor(kv)
        try:
            kv.init("w", np.zeros(4, np.float32))
            for _ in range(20):
                kv.push("w", np.ones(4, np.float32))
                kv.pull("w")
            assert wait_until(lambda t=topic: t in handle.client.run_on_scheduler(_topics), 10)
            if end == "unwatch":
                mon.close()
                time.sleep(2.5)  # the scheduler looks again for a last batch (FORGET_AGAIN_S)
                assert topic not in handle.client.run_on_scheduler(_topics)
                kv.push("w", np.ones(4, np.float32))  # unwatched: nothing is sent
                time.sleep(0.3)
                assert topic not in handle.client.run_on_scheduler(_topics)
        finally:
            mon.close()
            kv.close()
        time.sleep(2.5)
        assert topic not in handle.client.run_on_scheduler(_topics), end
