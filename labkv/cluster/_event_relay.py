"""Events from the cluster: batched on each server, delivered on the notebook's bus.

A server's :class:`Shard` and its round bookkeeping emit ordinary
:class:`~labkv.events.Event` objects on the server's own bus, and so does the
store of each rank of ``run(fn, kvstore=kv)`` (its pushes and pulls, as the
ranks see them). While the notebook has a subscriber, an :class:`EventStream`
per server and per rank collects them and sends one ``Worker.log_event``
message every ~100 ms (a rank's every :data:`RANK_FLUSH_S`; never one per push)
on the store's topic; the
notebook's :class:`ClusterBus` receives them through ``Client.subscribe_topic``
and hands them to its subscribers with ``bus.deliver``, so a view cannot tell
a cluster event from a local one.

Nobody subscribed means nothing is built or sent: the server's bus is inactive
(``Shard`` checks ``bus.active``), no flush task runs, and ranks start no stream
(a rank streams when the notebook's store had subscribers as ``run`` started:
``run`` blocks the notebook, so they cannot change meanwhile).

A server's stream subscribes with the detail the notebook's subscribers ask
for (``detail_interval``/``detail_burst`` of :meth:`EventBus.subscribe`; the
monitor asks for at most 4 detailed events per op, key and rank every 100 ms):
further pushes of a busy run are only counted by ``bus.admit``, and every flush
first runs ``bus.flush()``, which turns the counts into ``count``-carrying
events, so the totals the notebook sees stay exact while the server builds no
value summary per push.

Why ``log_event``/``subscribe_topic``: it is push-based, keeps per-server
order, and rides the worker's and scheduler's existing batched streams
(~2 ms latency measured here; ``docs/design.md``, "How calls travel"); polling an actor for
its buffer queues behind pushes on the same actor, and ``distributed.Queue``
costs a scheduler round trip per put.

>>> bus = ClusterBus("demo")
>>> seen = []
>>> sub = bus.subscribe(seen.append)
>>> bus.receive((0.0, pack_batch([{"seq": 0, "time": 1.0, "store": "demo", "op": "load", "key": None}])))
>>> seen[0].op
'load'
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import threading
from collections.abc import Callable
from typing import Any

from ..events import Event, EventBus, Subscription

FLUSH_INTERVAL_S = 0.1

#: a rank's stream flushes this often: its batches are its calls' counts and
#: detailed events, which the notebook folds one by one; a server's (every
#: FLUSH_INTERVAL_S) carry the rounds, waits and loads the views show as they
#: change. At 8 ranks of 500 keys, flushing each rank 10 times a second cost the
#: notebook more than every other part of watching together.
RANK_FLUSH_S = 0.5


#: the ranks of a run share the detail the notebook asks for once there are more than this
RANKS_IN_DETAIL = 8


def rank_detail(bus: EventBus, ranks: int) -> tuple[float, int]:
    """The detail each of ``ranks`` ranks streams with: the notebook's
    (``bus.detail_interval``, ``bus.detail_burst``), its interval stretched so
    that all ranks together send as many detailed events as
    :data:`RANKS_IN_DETAIL` ranks would. Each rank's stream has its own budget
    per op (``labkv/events/_tally.py``): at 64 ranks, 64 of them were more detail than
    any view shows, and cost the run more than its counts.

    >>> bus = ClusterBus("demo")
    >>> _ = bus.subscribe(print, detail_interval=0.1, detail_burst=4)
    >>> rank_detail(bus, 4), rank_detail(bus, 64)
    ((0.1, 4), (0.8, 4))
    """
    return bus.detail_interval * max(1.0, ranks / RANKS_IN_DETAIL), bus.detail_burst


def topic_of(store_id: str) -> str:
    """The ``log_event`` topic of a store's events.

    >>> topic_of("dist_sync-1234")
    'labkv-events-dist_sync-1234'
    """
    return f"labkv-events-{store_id}"


class EventStream:
    """Collects one bus's events and sends them in batches while on: a server's
    (with its ``load``), or a rank's, whose events are made on the rank's thread
    while the flushes run on the worker's event loop (hence the lock)."""

    def __init__(
        self,
        bus: EventBus,
        send: Callable[[list[dict[str, Any]]], None],
        load: Callable[[], dict[str, Any]] | None = None,
        interval: float = FLUSH_INTERVAL_S,
        annotate: Callable[[dict[str, Any]], None] | None = None,
        keep: Callable[[Event], bool] | None = None,
    ):
        self.bus, self.send, self.load, self.interval = bus, send, load, interval
        self.annotate = annotate
        self.keep = keep  # which events it sends (None: all)
        self.buffer: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._sub: Subscription | None = None
        self._task: asyncio.Task | None = None
        self._last_load: dict[str, Any] | None = None

    @property
    def on(self) -> bool:
        return self._sub is not None

    @property
    def settings(self) -> tuple[float, int] | None:
        """``(detail_interval, detail_burst)`` while on, else None: what
        :meth:`start` takes to stream the same way."""
        sub = self._sub
        return None if sub is None else (sub.detail_interval, sub.detail_burst)

    def _collect(self, event: Event) -> None:
        if self.keep is not None and not self.keep(event):
            return
        data = event.to_dict()
        if self.annotate is not None:
            self.annotate(data)
        with self._lock:
            self.buffer.append(data)

    def _take(self) -> list[dict[str, Any]]:
        with self._lock:
            batch, self.buffer = self.buffer, []
        return batch

    def start(self, detail_interval: float = 0.0, detail_burst: int = 1) -> None:
        """Start collecting and flushing (runs on the worker's event loop), with
        the detail the notebook asks for (see module doc); a running stream
        takes new settings."""
        sub = self._sub
        if sub is not None:
            if (sub.detail_interval, sub.detail_burst) == (detail_interval, detail_burst):
                return
            self.bus.flush()  # what was counted under the old settings
            sub.unsubscribe()
        # Each rank and server streams: one detailed slot's burst per op and interval
        # each is plenty for the notebook's views (labkv/events/_tally.py).
        self.bus.op_budget = 1
        self._sub = self.bus.subscribe(self._collect, detail_interval, detail_burst)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    def stop(self) -> None:
        """Stop collecting; what is buffered (and counted) is sent first."""
        if self._sub is not None:
            self.flush()
            self._sub.unsubscribe()
            self._sub = None
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _loop(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            while self._sub is not None:
                await asyncio.sleep(self.interval)
                self.flush()

    def flush(self) -> None:
        """Send the buffered events (with the calls only counted since the last
        flush) and, when it changed, one ``load`` event."""
        if self._sub is not None:
            self.bus.flush()  # counted calls -> count-carrying events, into the buffer
        batch = self._take()
        load = self.load() if self.load is not None else None
        if load is not None and load != self._last_load:
            self._last_load = dict(load)
            event = self.bus.emit("load", None, server=load.pop("server"), extra=load)
            if event is not None:  # emitted into self.buffer by our own subscriber
                batch.extend(self._take())
        if batch:
            self.send(pack_batch(batch))


class ClusterBus(EventBus):
    """The notebook-side bus of a cluster store: turns streaming on with the
    first subscriber and off with the last (via ``on_active(active, remote)``;
    also called when the detail the subscribers ask for changes, or whether any
    of them wants the other processes' events here: ``remote``), and delivers
    batches that arrive from servers (:meth:`receive`)."""

    def __init__(self, store_id: str, on_active: Callable[[bool, bool], None] | None = None):
        self._on_active = on_active
        super().__init__(store_id)
        self._told = (self.active, self.remote, self.detail_interval, self.detail_burst)

    def _changed(self) -> None:
        # Outside the bus lock: telling the servers waits for their answers, which
        # arrive on the Dask client's thread, where batches of events are being
        # delivered under that lock (holding it here deadlocked the two).
        now = (self.active, self.remote, self.detail_interval, self.detail_burst)
        if now != self._told and self._on_active is not None:
            self._told = now
            self._on_active(self.active, self.remote)

    def receive(self, message: tuple[float, bytes]) -> None:
        """A ``subscribe_topic`` handler: deliver one batch of events (as
        :func:`pack_batch` sent it), in order."""
        _, batch = message
        self.deliver_many(Event.from_dict(d) for d in pickle.loads(batch))


def pack_batch(batch: list[dict[str, Any]]) -> bytes:
    """A batch of event dicts as it travels: one pickled ``bytes``. Dask's
    ``log_event`` walks a message to check that msgpack can carry it and to
    size it, and msgpack turns tuples into lists: on a watched run's servers the
    walk cost more than building the events; one blob is neither walked nor
    changed. (Only labkv reads the store's topic, and every node runs the same
    labkv, which the cluster check makes sure of.)

    >>> pickle.loads(pack_batch([{"op": "push", "extra": {"pushed": (1, 2)}}]))
    [{'op': 'push', 'extra': {'pushed': (1, 2)}}]
    """
    return pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
