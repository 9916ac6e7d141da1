"""A primary's small log entries travel to its backup on a plain socket (the
:mod:`labkv.cluster._transport.channel`), on the session's real 2-worker LocalCluster:
they arrive and are applied, big entries still go as actor calls, and a
backup without a listener, or a channel that breaks, loses no entry."""

from __future__ import annotations

import numpy as np
import pytest

import labkv
from labkv.cluster._transport.channel import entries_served

SMALL, BIG = 5, 1 << 15  # float32 elements: one entry under PACK_BELOW, one above


def _listener(dask_worker):
    from labkv.cluster._transport.channel import HANDLER

    handler = getattr(dask_worker, "_labkv_hidden", None) or dask_worker.handlers.get(HANDLER)
    return None if handler is None else handler.__self__


def _served_even_hidden(dask_worker):
    return _listener(dask_worker).served


def _replicas(topic, key, dask_worker=None):
    """Each server of the store ``topic`` on this worker: (sid, is primary,
    entries applied, the key's value)."""
    return [
        (a.sid, a.primary, a.issued, np.array(a.shard.read(key)))
        for a in dask_worker.state.actors.values()
        if getattr(a, "topic", None) == topic and key in a.shard
    ]


def _run_on(handle, fn, address, *args):
    return handle.client.run(fn, *args, workers=[address])[address]


def _store(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=1, replicas=2, timeout=20)
    kv.init(["small", "big"], [np.zeros(SMALL, np.float32), np.zeros(BIG, np.float32)])
    primary, backup = kv.placement()["small"][0]["replicas"]
    return kv, primary, backup


def _rounds(kv, key, n, size):
    out = np.empty(size, np.float32)
    for step in range(n):
        kv.push(key, np.full(size, step + 1, np.float32))
        kv.pull(key, out=out)
    return out


def _check_backup_equals_primary(handle, kv, primary, backup, key):
    from labkv.cluster._events import topic_of

    (mine,) = _run_on(handle, _replicas, primary, topic_of(kv._id), key)
    (theirs,) = _run_on(handle, _replicas, backup, topic_of(kv._id), key)
    assert mine[1] and not theirs[1]  # primary, backup
    assert theirs[2] == mine[2]  # the same entries applied
    np.testing.assert_array_equal(theirs[3], mine[3])


def test_small_entries_travel_on_the_channel_and_big_ones_as_actor_calls(handle):
    kv, primary, backup = _store(handle)
    try:
        before = _run_on(handle, entries_served, backup)
        np.testing.assert_array_equal(_rounds(kv, "small", 6, SMALL), np.full(SMALL, 6))
        after_small = _run_on(handle, entries_served, backup)
        assert after_small - before == 6  # one entry a round, each applied by the backup
        np.testing.assert_array_equal(_rounds(kv, "big", 3, BIG), np.full(BIG, 3))
        assert _run_on(handle, entries_served, backup) == after_small  # big values: actor calls
        for key in ("small", "big"):
            _check_backup_equals_primary(handle, kv, primary, backup, key)
    finally:
        kv.close()


def _hide_listener(dask_worker):
    from labkv.cluster._transport.channel import HANDLER

    dask_worker._labkv_hidden = dask_worker.handlers[HANDLER]
    dask_worker.handlers[HANDLER] = lambda: None  # as on a worker whose comm is not TCP


def _restore_listener(dask_worker):
    from labkv.cluster._transport.channel import HANDLER

    dask_worker.handlers[HANDLER] = dask_worker.__dict__.pop("_labkv_hidden")


def test_a_backup_without_a_listener_gets_its_entries_as_actor_calls(handle):
    kv, primary, backup = _store(handle)
    _run_on(handle, _hide_listener, backup)
    try:
        before = _run_on(handle, _served_even_hidden, backup)
        np.testing.assert_array_equal(_rounds(kv, "small", 4, SMALL), np.full(SMALL, 4))
        assert _run_on(handle, _served_even_hidden, backup) == before
        _check_backup_equals_primary(handle, kv, primary, backup, "small")
    finally:
        _run_on(handle, _restore_listener, backup)
        kv.close()


def _break_connections(dask_worker):
    listener = _listener(dask_worker)
    for writer in list(listener.connections):
        writer.transport.abort()
    return len(listener.connections)


def test_a_broken_channel_is_opened_again_and_loses_no_entry(handle):
    kv, primary, backup = _store(handle)
    try:
        _rounds(kv, "small", 3, SMALL)
        assert _run_on(handle, _break_connections, backup) >= 1
        served = _run_on(handle, entries_served, backup)
        out = _rounds(kv, "small", 5, SMALL)
        np.testing.assert_array_equal(out, np.full(SMALL, 5))
        # entries after the break: at most the first went as an actor call
        assert _run_on(handle, entries_served, backup) - served >= 4
        _check_backup_equals_primary(handle, kv, primary, backup, "small")
    finally:
        kv.close()


def _drop_the_next_entry(dask_worker):
    """The next entry to arrive on a channel breaks its connection unanswered
    and unapplied, as when the connection dies with the entry in flight."""
    listener = _listener(dask_worker)

    async def drop(writer, call_id, actor_key, entry):
        del listener._answer  # back to the class's method
        writer.transport.abort()

    listener._answer = drop


def test_an_entry_in_flight_on_a_channel_that_breaks_goes_again_as_an_actor_call(handle):
    kv, primary, backup = _store(handle)
    try:
        _rounds(kv, "small", 2, SMALL)
        served = _run_on(handle, entries_served, backup)
        _run_on(handle, _drop_the_next_entry, backup)
        np.testing.assert_array_equal(_rounds(kv, "small", 4, SMALL), np.full(SMALL, 4))
        # the dropped entry went again as an actor call; the next three on a new channel
        assert _run_on(handle, entries_served, backup) - served == 3
        _check_backup_equals_primary(handle, kv, primary, backup, "small")
    finally:
        kv.close()


@pytest.mark.parametrize("token", [b"", b"x" * 16])
def test_a_connection_without_the_token_is_closed_unread(handle, token):
    import asyncio

    from labkv.cluster._transport.channel import HANDLER

    address = handle.client.scheduler_info()["workers"].popitem()[0]

    async def knock():
        from distributed.core import rpc

        async with rpc(address) as worker:
            host, port, _ = await getattr(worker, HANDLER)()
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(token + b"\0" * 64)
        got = await asyncio.wait_for(reader.read(), 10)  # b"" once the listener closes it
        writer.close()
        return got

    assert asyncio.run(knock()) == b""
