"""A rank's plain link to a server on another worker has a stream of its own, which the
worker's loop does not watch: the rank's thread reads its replies while it waits
(``labkv.cluster._transport.stream.Pumped``). On the session's real 2-worker
LocalCluster: the calls go there and give the same values, a held push the loop's
timer sent is still waited for, a broken stream is opened again, and the stream
closes with its store."""

from __future__ import annotations

import gc
import time

import numpy as np

from labkv.cluster import run
from labkv.cluster._rank import holding as _holding
from labkv.cluster._transport import stream as _stream
from labkv.cluster._transport.dask import StreamLink, worker_loop
from tests.test_cluster_stream import _sum_ranks


def _own_streams(kv):
    """The rank's links that have a stream of their own."""
    return [
        link for link in kv._calls.links if isinstance(link, StreamLink) and link.own is not None
    ]


def _wires_into(dask_worker):
    handler = dask_worker.handlers.get(_stream.HANDLER)
    return 0 if handler is None else len(handler.__self__.wires)


def _sum_with_own_stream_report(kv):
    """Three rounds; for each own stream: whether its wire is read by this thread
    only (not registered with the worker's loop)."""
    from distributed import get_worker

    out = _sum_ranks(kv)
    watched = worker_loop(get_worker())._selector.get_map()
    report = [
        (link.own.pumped, link.own.wire.fd in watched, link.own.comm.closed())
        for link in _own_streams(kv)
    ]
    return out, report


def test_a_ranks_calls_to_another_worker_are_read_by_its_own_thread(handle):
    results = run(_sum_with_own_stream_report, num_workers=2, cluster=handle, num_servers=1)
    for out, _ in results:
        np.testing.assert_array_equal(out, np.full(2, 3.0))  # a round stores 1 + 2
    reports = [r for _, report in results for r in report]
    # one rank shares its worker with the server (in-process), the other has a stream
    assert reports == [(True, False, False)], reports


def _push_then_compute(kv):
    """A push the loop's timer sends while the rank computes, then a barrier, which
    waits for it (and reads its reply from the rank's own stream)."""
    kv.init("w", np.zeros(2, np.float32))
    out = np.empty(2, np.float32)
    sent_by_timer = 0
    for _ in range(3):
        kv.push("w", np.full(2, 1.0, np.float32))
        time.sleep(20 * _holding.HOLD_S)  # the timer sends it, not the pull
        sent_by_timer += sum(f.read is not None for _, f in kv._calls.inflight)
        kv.barrier()  # flushes: waits for every push in flight
        kv.pull("w", out=out)
    return out, sent_by_timer, len(_own_streams(kv))


def test_a_held_push_the_timer_sent_is_waited_for_on_the_ranks_own_stream(handle):
    results = run(_push_then_compute, num_workers=2, cluster=handle, num_servers=1, timeout=10)
    for out, _, _ in results:
        np.testing.assert_array_equal(out, np.full(2, 2.0))  # a round stores the 2 pushes
    (own,) = [(sent, n) for _, sent, n in results if n]
    assert own[0] >= 1, results  # the rank with its own stream had timer-sent pushes


def _unheld_pushes(kv):
    """Pushes too big to be held and too small to be waited for: in flight on the
    rank's own stream when the next push asks whether they are done."""
    n = 1 << 16  # 256 KiB of float32: over the held size, under ACK_ABOVE
    kv.init("w", np.zeros(n, np.float32))
    out = np.empty(n, np.float32)
    for _ in range(3):
        kv.push("w", np.ones(n, np.float32))
        kv.push("w", np.ones(n, np.float32))
        kv.pull("w", out=out)
    kv.push("w", np.ones(n, np.float32))  # its reply comes while nobody waits
    (_, push), own = kv._calls.inflight[0], bool(_own_streams(kv))
    deadline = time.monotonic() + 10
    while not push.done() and time.monotonic() < deadline:
        time.sleep(0.01)
    return out[:3], own, push.done()


def test_a_push_in_flight_on_the_own_stream_is_asked_whether_it_is_done(handle):
    results = run(_unheld_pushes, num_workers=2, cluster=handle, num_servers=1, timeout=10)
    for out, _, _ in results:
        np.testing.assert_array_equal(out, np.full(3, 2.0))  # the last round's 2 pushes
    # done() reads the reply that arrived: it does not wait for a wait to read it
    assert [done for _, own, done in results if own] == [True], results


def _break_own_stream_then_pull(kv):
    kv.init("w", np.zeros(2, np.float32))
    out = np.empty(2, np.float32)
    kv.push("w", np.full(2, 1.0, np.float32))
    kv.pull("w", out=out)
    kv.barrier()
    broken = []
    for link in _own_streams(kv):
        old = link.own.wire
        old.abort()  # as a network failure would
        broken.append(old)
    kv.barrier()  # rank 0 waits here while rank 1 makes its next call on a new comm
    kv.pull("w", out=out)
    kv.barrier()
    return out, [link.own.wire is not old for link, old in zip(_own_streams(kv), broken)]


def test_the_call_after_a_broken_own_stream_opens_a_new_one(handle):
    results = run(_break_own_stream_then_pull, num_workers=2, cluster=handle, num_servers=1)
    for out, _ in results:
        np.testing.assert_array_equal(out, np.full(2, 2.0))
    assert [r for _, renewed in results for r in renewed] == [True], results


def _one_round(kv):
    kv.init("w", np.zeros(2, np.float32))
    kv.push("w", np.ones(2, np.float32))
    kv.barrier()
    return len(_own_streams(kv))


def test_a_ranks_own_streams_close_with_its_store(handle):
    workers = handle.workers()
    before = {w: handle.client.run(_wires_into, workers=[w])[w] for w in workers}
    assert sum(run(_one_round, num_workers=2, cluster=handle, num_servers=1)) == 1
    deadline = time.monotonic() + 20
    while True:
        handle.client.run(gc.collect)
        now = {w: handle.client.run(_wires_into, workers=[w])[w] for w in workers}
        if all(now[w] <= before[w] for w in workers) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert all(now[w] <= before[w] for w in workers), (before, now)
