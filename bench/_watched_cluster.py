"""A watched dist_sync run in this process, for ``bench/monitor_overhead.py``.

W real ``DistStore`` ranks (one thread each) push and pull K tiny keys per
round on S real ``Server`` objects (one asyncio loop thread, every message
pickled as Dask would: ``InProcessServers(wire=True)``). The notebook's side is
a :class:`~labkv.cluster._event_relay.ClusterBus`: the servers' batches (and the
ranks' own, from one :class:`~labkv.cluster._event_relay.EventStream` per rank, as
``run`` starts them) are delivered to it on the loop thread, as the Dask
client's thread would, and a monitor watches it. Everything shares one process
and its GIL, so a round's time is the cluster's CPU cost plus the monitor's.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from typing import Any

import numpy as np

from labkv.cluster._event_relay import RANK_FLUSH_S, ClusterBus, EventStream, rank_detail
from labkv.cluster._options import StoreSpec
from labkv.cluster._rank.dist_store import DistStore
from labkv.cluster._runtime.inprocess import InProcessServers
from labkv.cluster._server.actor import Server
from labkv.cluster._transport.base import wait_all

__all__ = ["WatchedCluster"]

STORE_ID = "dist_sync-bench"


class _Notebook:
    """What a monitor reads of the notebook's store: its bus, type, peek, placement."""

    type = "dist_sync"

    def __init__(self, bus: ClusterBus, rank0: DistStore):
        self.events, self._rank0 = bus, rank0

    def peek(self, key: Any) -> Any:
        return self._rank0.peek(key)

    def placement(self) -> dict[Any, Any]:
        return self._rank0.placement()


class WatchedCluster:
    """``workers`` ranks on ``servers`` in-process servers, ``keys`` keys of 4 floats."""

    def __init__(self, workers: int, servers: int, keys: int, timeout: float = 120.0):
        self.workers, self.keys = workers, list(range(keys))
        self.bus = ClusterBus(STORE_ID, self._streaming)

        def make(s: int, host: Any) -> Server:
            return Server(s, STORE_ID, workers, True, timeout, "bench", "cpu", None, host=host)

        self.group = InProcessServers(make, servers, wire=True)
        self.group.host.log_event = lambda topic, batch: self.bus.receive((0.0, batch))
        spec = StoreSpec("dist_sync", STORE_ID, servers, ["in-process"] * servers, 1000, timeout)
        self.ranks = [
            DistStore(copy.deepcopy(spec), [], r, workers, owner=r == 0, links=self.group.links)
            for r in range(workers)
        ]
        self.ranks[0].init(self.keys, [np.zeros(4, np.float32) for _ in self.keys])
        self.kv = _Notebook(self.bus, self.ranks[0])
        self._streams: list[EventStream] = []
        self.cpu = 0.0

    def _on_loop(self, fn: Any) -> None:
        async def call() -> None:
            fn()

        asyncio.run_coroutine_threadsafe(call(), self.group.loop).result(30)

    def _streaming(self, on: bool, remote: bool = True) -> None:
        """The bus's first subscriber came or its last left: the servers stream
        (as ``Streaming.set`` tells them), and so do the ranks (as ``run`` does).
        ``remote`` (whether a subscriber wants the servers' events here) is always
        honoured: the servers' batches reach this bus directly, not by a topic."""
        detail = (self.bus.detail_interval, self.bus.detail_burst) if on else ()
        links = self.group.links
        wait_all([(link, link.call("streaming", on, *detail)) for link in links], "stream", 30)
        if on:
            self._streams = [
                EventStream(
                    kv.events, lambda batch: self.bus.receive((0.0, batch)), interval=RANK_FLUSH_S
                )
                for kv in self.ranks
            ]
            ranks = rank_detail(self.bus, self.workers)  # as run() starts them
            self._on_loop(lambda: [s.start(*ranks) for s in self._streams])
        else:
            self._on_loop(lambda: [s.stop() for s in self._streams])
            self._streams = []

    def rounds(self, n: int) -> float:
        """Run ``n`` rounds (each rank pushes then pulls every key); seconds per
        round (:attr:`cpu`: this process's CPU seconds per round, in the same time)."""
        values = [np.ones(4, np.float32) for _ in self.keys]
        start = threading.Barrier(self.workers + 1)
        errors: list[BaseException] = []

        def rank(kv: DistStore) -> None:
            outs = [np.empty(4, np.float32) for _ in self.keys]
            start.wait()
            try:
                for _ in range(n):
                    kv.push(self.keys, values)
                    kv.pull(self.keys, out=outs)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=rank, args=(kv,)) for kv in self.ranks]
        for t in threads:
            t.start()
        start.wait()
        t0, cpu0 = time.perf_counter(), time.process_time()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        self.cpu = (time.process_time() - cpu0) / n
        if errors:
            raise errors[0]
        return elapsed / n

    def close(self) -> None:
        for kv in self.ranks:
            kv.flush()
        self.group.close()
