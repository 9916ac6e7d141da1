"""Every call between processes travels on a stream (``labkv.cluster._transport.stream``):
one Dask comm per (caller, worker) to the worker's own listener, on the
session's real 2-worker LocalCluster. Calls arrive and are answered there, a
broken stream is opened again without losing a log entry, the worker end calls
nothing but a server's remote methods, the notebook falls back to actor calls
where it cannot reach a worker, and no worker opens a listener of its own."""

from __future__ import annotations

import asyncio

import dask
import numpy as np
import pytest

import labkv
from labkv.cluster import run
from labkv.cluster._transport import dask as _dask
from labkv.cluster._transport import stream as _stream
from labkv.cluster._transport.stream import calls_served

SMALL, BIG = 5, 1 << 15  # float32 elements: one entry under PACK_BELOW, one above


def _run_on(handle, fn, address, *args):
    return handle.client.run(fn, *args, workers=[address])[address]


def _replicas(topic, key, dask_worker=None):
    """Each server of the store ``topic`` on this worker: (is primary, entries
    applied, the key's value)."""
    return [
        (a.primary, a.log.issued, np.array(a.shard.read(key)))
        for a in dask_worker.state.actors.values()
        if getattr(a, "topic", None) == topic and key in a.shard
    ]


def _replicated_store(handle):
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
    from labkv.cluster._event_relay import topic_of

    (mine,) = _run_on(handle, _replicas, primary, topic_of(kv._id), key)
    (theirs,) = _run_on(handle, _replicas, backup, topic_of(kv._id), key)
    assert mine[0] and not theirs[0]  # primary, backup
    assert theirs[1] == mine[1]  # the same entries applied
    np.testing.assert_array_equal(theirs[2], mine[2])


def test_the_notebook_stores_calls_go_on_streams(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=1, timeout=20)
    try:
        assert all(type(link) is _dask.StreamLink for link in kv._links)
        kv.init("w", np.zeros(3, np.float32))
        address = kv.placement()["w"][0]["replicas"][0]
        before = _run_on(handle, calls_served, address)
        np.testing.assert_array_equal(_rounds(kv, "w", 4, 3), np.full(3, 4))
        assert _run_on(handle, calls_served, address) - before >= 4  # a pull a round at least
    finally:
        kv.close()


def test_log_entries_small_and_big_reach_the_backup_on_its_stream(handle):
    kv, primary, backup = _replicated_store(handle)
    try:
        before = _run_on(handle, calls_served, backup)
        np.testing.assert_array_equal(_rounds(kv, "small", 6, SMALL), np.full(SMALL, 6))
        np.testing.assert_array_equal(_rounds(kv, "big", 3, BIG), np.full(BIG, 3))
        assert _run_on(handle, calls_served, backup) - before == 9  # one entry a round
        for key in ("small", "big"):
            _check_backup_equals_primary(handle, kv, primary, backup, key)
    finally:
        kv.close()


def _break_incoming_streams(dask_worker):
    """Abort every stream into this worker, as a network failure would."""
    handler = dask_worker.handlers.get(_stream.HANDLER)  # none before a server starts
    wires = [] if handler is None else list(handler.__self__.wires)
    for wire in wires:
        wire.comm.abort()
    return len(wires)


def test_a_broken_stream_is_opened_again_and_loses_no_entry(handle):
    kv, primary, backup = _replicated_store(handle)
    try:
        _rounds(kv, "small", 3, SMALL)
        assert _run_on(handle, _break_incoming_streams, backup) >= 1
        served = _run_on(handle, calls_served, backup)
        np.testing.assert_array_equal(_rounds(kv, "small", 5, SMALL), np.full(SMALL, 5))
        assert _run_on(handle, calls_served, backup) - served >= 5
        _check_backup_equals_primary(handle, kv, primary, backup, "small")
    finally:
        kv.close()


def _sum_ranks(kv):
    kv.init("w", np.zeros(2, np.float32))
    out = np.empty(2, np.float32)
    for _ in range(3):
        kv.push("w", np.full(2, kv.rank + 1, np.float32))
        kv.pull("w", out=out)
        kv.barrier()
    return out


def test_a_runs_ranks_and_barriers_go_on_streams_to_the_servers(handle):
    workers = handle.workers()
    before = {w: _run_on(handle, calls_served, w) for w in workers}
    for out in run(_sum_ranks, num_workers=2, cluster=handle, num_servers=1):
        np.testing.assert_array_equal(out, [3.0, 3.0])
    # on the server's worker: the other rank's pulls and barriers (its own rank's
    # go in-process)
    served = {w: _run_on(handle, calls_served, w) - before[w] for w in workers}
    assert max(served.values()) >= 3 + 3, served


def _actor_keys(dask_worker):
    return list(dask_worker.state.actors)


def _raw_messages(address, *messages):
    """Write ``messages`` (``(seq, kind, (actor_key, method, args))``) on a stream
    of Dask messages; the first message that comes back."""
    from distributed.comm import connect

    async def once():
        comm = await connect(address)
        try:
            # no "framing" in the hello: the worker end reads Dask messages
            await comm.write({"op": _stream.HANDLER, "reply": False})
            for seq, kind, request in messages:
                await comm.write({"i": seq, "t": kind, "v": request})
            return await asyncio.wait_for(comm.read(), 10)
        finally:
            comm.abort()

    return asyncio.run(once())


def _raw_call(address, actor_key, method, args):
    return _raw_messages(address, (7, _stream.REQUEST, (actor_key, method, args)))


def _server_of(handle, kv):
    """The worker address and actor key of the store's server 0."""
    address = kv.placement()["w"][0]["replicas"][0]
    (key,) = [k for k in _run_on(handle, _actor_keys, address) if k in str(kv._servers[0])]
    return address, key


def test_a_notice_runs_the_method_and_gets_no_answer(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=1, timeout=20)
    try:
        kv.init("w", np.ones(2, np.float32))
        address, key = _server_of(handle, kv)
        before = _run_on(handle, calls_served, address)
        request = (key, "keys", [None])
        reply = _raw_messages(address, (7, _stream.NOTICE, request), (8, _stream.REQUEST, request))
        assert reply["i"] == 8 and reply["t"] == _stream.RESULT  # the request's, first
        assert _run_on(handle, calls_served, address) - before == 2  # both ran
    finally:
        kv.close()


def test_the_worker_end_calls_only_a_servers_remote_methods(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=1, timeout=20)
    try:
        kv.init("w", np.ones(2, np.float32))
        address, key = _server_of(handle, kv)
        reply = _raw_call(address, key, "__init__", [0, "x", 1, True, 1.0, "t"])
        assert reply["i"] == 7 and reply["t"] == _stream.ERROR
        assert isinstance(reply["v"], KeyError)
        assert "no server method '__init__'" in str(reply["v"])
        gone = _raw_call(address, "no-such-actor", "peek", [["w"]])
        assert gone["t"] == _stream.GONE and gone["v"].startswith("no server no-such-actor")
        reply = _raw_call(address, key, "keys", [None])
        assert reply["t"] == _stream.RESULT and reply["v"]["w"].shape == (2,)
        out = np.empty(2, np.float32)
        kv.pull("w", out=out)
        np.testing.assert_array_equal(out, [1.0, 1.0])  # nothing changed
    finally:
        kv.close()


def test_a_notebook_that_cannot_reach_a_worker_calls_its_servers_as_actors(handle, monkeypatch):
    monkeypatch.setattr(_dask, "reaches", lambda client, address, actor_key: False)
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2, timeout=20)
    try:
        assert all(type(link) is _dask.ActorLink for link in kv._links)
        kv.init("w", np.zeros(3, np.float32))
        np.testing.assert_array_equal(_rounds(kv, "w", 3, 3), np.full(3, 3))
    finally:
        kv.close()


def test_the_actor_path_is_chosen_by_config_and_a_bad_setting_is_refused(handle):
    with dask.config.set({"labkv.transport": "actor"}):
        kv = labkv.create("dist_sync", cluster=handle, num_servers=1, timeout=20)
    try:
        assert all(type(link) is _dask.ActorLink for link in kv._links)
    finally:
        kv.close()
    bad = pytest.raises(ValueError, match="labkv.transport must be 'auto' or 'actor'")
    with dask.config.set({"labkv.transport": "sockets"}), bad:
        _dask.notebook_link(0, "tcp://127.0.0.1:1", None, handle.client)


def test_reaching_an_address_nobody_listens_on_fails_fast_and_is_remembered(handle):
    address = "tcp://127.0.0.1:9"  # the discard port: refused at once
    assert _dask.reaches(handle.client, address, "labkv-server-none") is False
    assert _dask.reaches(handle.client, address, "labkv-server-none") is False


def _listening_ports(dask_worker):
    """The TCP ports this worker process listens on, and the ones Dask opened."""
    import psutil

    listening = {
        c.laddr.port
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }
    dasks = {dask_worker.port}
    if dask_worker.http_server is not None:
        dasks.add(dask_worker.http_server.port)
    return listening, dasks


def test_no_worker_opens_a_listener_other_than_dasks(handle):
    kv, primary, backup = _replicated_store(handle)
    try:
        _rounds(kv, "small", 3, SMALL)
        run(_sum_ranks, num_workers=2, cluster=handle, num_servers=2, replicas=2)
        for address in handle.workers():
            listening, dasks = _run_on(handle, _listening_ports, address)
            assert listening and listening <= dasks, (address, listening, dasks)
    finally:
        kv.close()


def _set_framing(value, dask_worker=None):
    dask.config.set({"labkv.stream-framing": value})


def _stream_framings(dask_worker):
    """How each stream into this worker is framed, by the wire's class name."""
    service = dask_worker.handlers[_stream.HANDLER].__self__
    return sorted({type(w).__name__ for w in service.wires})


def _store_through_rounds(handle):
    """A replicated store after small and big rounds (each value checked), its
    backup checked equal to its primary."""
    kv, primary, backup = _replicated_store(handle)
    try:
        np.testing.assert_array_equal(_rounds(kv, "small", 3, SMALL), np.full(SMALL, 3))
        np.testing.assert_array_equal(_rounds(kv, "big", 2, BIG), np.full(BIG, 2))
        _check_backup_equals_primary(handle, kv, primary, backup, "big")
    except BaseException:
        kv.close()
        raise
    return kv, primary, backup


@pytest.mark.parametrize("framing", ["messages", "frames"])
def test_both_framings_carry_big_and_small_values_and_log_entries(handle, framing):
    handle.client.run(_set_framing, framing)
    _set_framing(framing)
    handle.client.run(_break_incoming_streams)  # every caller opens its streams anew
    try:
        kv, primary, backup = _store_through_rounds(handle)
        try:
            wires = {"messages": "_Messages", "frames": "SocketFrames"}
            wires = wires[framing]
            assert _run_on(handle, _stream_framings, backup) == [wires]
        finally:
            kv.close()
        for out in run(_sum_ranks, num_workers=2, cluster=handle, num_servers=2, replicas=2):
            np.testing.assert_array_equal(out, [3.0, 3.0])
    finally:
        handle.client.run(_set_framing, "frames")
        _set_framing("frames")


def test_the_worker_end_frames_a_stream_as_its_caller_chose(handle):
    # The workers frame their own streams as Dask messages, the notebook its own as
    # frames: each worker end reads what its caller's hello says, whatever its config.
    handle.client.run(_set_framing, "messages")
    handle.client.run(_break_incoming_streams)
    try:
        kv, primary, backup = _store_through_rounds(handle)
        try:
            assert "SocketFrames" in _run_on(handle, _stream_framings, primary)  # the notebook's
            assert "_Messages" in _run_on(handle, _stream_framings, backup)  # the primary's
        finally:
            kv.close()
    finally:
        handle.client.run(_set_framing, "frames")
