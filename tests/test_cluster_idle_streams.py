"""Peers that send a stream's hello and then stay silent cannot pin a worker's
fds and memory: at most ``labkv.stream-max-waiting`` streams that have not yet
served a call stay open on a worker (the oldest is closed to make room), and
each is closed after ``labkv.stream-first-call-timeout`` seconds; when the
peers go, their streams' fds and buffers go too. 500 such streams against a
real worker of the session LocalCluster; a real store is used meanwhile and
after."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import dask
import numpy as np
import pytest

import labkv
from labkv.cluster._transport import stream as _stream

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

STREAMS = 500
#: Only stops a hang: the worker closes the silent streams long before.
DEADLINE_S = 120


def _usage(dask_worker):
    """This worker's open fds, RSS (bytes) and streams that have not served a call."""
    import psutil

    return (
        len(os.listdir("/proc/self/fd")),
        psutil.Process().memory_info().rss,
        _stream.waiting_streams(dask_worker),
    )


def _set_limits(limit, timeout, dask_worker=None):
    dask.config.set({"labkv.stream-max-waiting": limit, "labkv.stream-first-call-timeout": timeout})


def _limits(dask_worker=None):
    return _stream.stream_limits()


class _SilentPeers:
    """Comms of this process to a worker, each with the stream's hello and then
    nothing, on an event loop of its own (as a stranger's process would)."""

    def __init__(self, address, connection_args):
        self.address, self.connection_args = address, connection_args
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.comms = []

    def open(self, n):
        asyncio.run_coroutine_threadsafe(self._open(n), self.loop).result(DEADLINE_S)

    async def _open(self, n):
        from distributed.comm import connect

        for _ in range(n):
            comm = await connect(self.address, **self.connection_args)
            self.comms.append(comm)
            await comm.write({"op": _stream.HANDLER, "reply": False, "framing": "socket"})
            assert await comm.read() == _stream.READY

    def close_comms(self):
        async def close_all():
            for comm in self.comms:
                comm.abort()
            self.comms.clear()

        asyncio.run_coroutine_threadsafe(close_all(), self.loop).result(DEADLINE_S)

    def close(self):
        self.close_comms()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(DEADLINE_S)
        self.loop.close()


def _wait_until_none_waits(client, address):
    deadline = time.monotonic() + DEADLINE_S
    while client.run(_usage, workers=[address])[address][2] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert client.run(_usage, workers=[address])[address][2] == 0


def _works(kv, step):
    kv.push("w", np.full(3, float(step), np.float32))
    np.testing.assert_array_equal(kv.pull("w"), np.full(3, float(step), np.float32))


def test_silent_streams_are_capped_and_closed_and_a_store_works_meanwhile(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=1, timeout=60)
    address = kv._links[0].address
    client = handle.client
    peers = _SilentPeers(address, client.connection_args)
    try:
        kv.init("w", np.zeros(3, np.float32))
        _works(kv, 1)
        limit = client.run(_limits, workers=[address])[address][0]
        # phase 1: no stream times out while they are opened; only the cap holds them
        client.run(_set_limits, limit, 3600, workers=[address])
        fds0, rss0, waiting0 = client.run(_usage, workers=[address])[address]
        assert waiting0 == 0  # the notebook's own stream has served calls
        peers.open(STREAMS // 2)
        _works(kv, 2)
        peers.open(STREAMS - STREAMS // 2)
        _works(kv, 3)
        fds1, rss1, waiting1 = client.run(_usage, workers=[address])[address]
        assert waiting1 == limit
        assert fds1 - fds0 <= 2 * limit + 16, (fds0, fds1)  # 2 fds each, no more streams
        assert rss1 - rss0 < 32 << 20, (rss0, rss1)  # not 250 KiB each for 500
        # phase 2: the peers go, and so do their streams
        peers.close_comms()
        _wait_until_none_waits(client, address)
        assert client.run(_usage, workers=[address])[address][0] - fds0 <= 16
        # phase 3: silent streams with a short timeout are closed by the worker
        client.run(_set_limits, limit, 1.0, workers=[address])
        peers.open(limit)
        _wait_until_none_waits(client, address)
        fds3 = client.run(_usage, workers=[address])[address][0]
        assert fds3 - fds0 <= 16, (fds0, fds3)
        _works(kv, 4)  # the notebook's stream, which served calls, was never closed
    finally:
        client.run(_set_limits, _stream.MAX_WAITING_STREAMS, _stream.FIRST_CALL_TIMEOUT_S)
        peers.close()
        kv.close()


def test_a_bad_stream_limit_fails_the_servers_start_naming_it(handle):
    from labkv.cluster import ClusterError

    handle.client.run(_set_limits, 0, _stream.FIRST_CALL_TIMEOUT_S)
    try:
        with pytest.raises(ClusterError, match="labkv.stream-max-waiting must be a positive int"):
            labkv.create("dist_sync", cluster=handle, num_servers=1, timeout=60)
    finally:
        handle.client.run(_set_limits, _stream.MAX_WAITING_STREAMS, _stream.FIRST_CALL_TIMEOUT_S)
    kv = labkv.create("dist_sync", cluster=handle, num_servers=1, timeout=60)
    try:
        kv.init("w", np.zeros(3, np.float32))
        _works(kv, 1)
    finally:
        kv.close()
