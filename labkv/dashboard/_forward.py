"""A watched notebook store's own events, forwarded to the scheduler.

A cluster store's servers (and the ranks of ``run``) send their events to the
scheduler themselves; the store the notebook holds makes its rank-side events
(its pushes and pulls as the caller sees them: shapes, values, pull counts) in
the notebook's process. :class:`Forward` collects those, and every
:data:`~labkv.cluster._event_relay.RANK_FLUSH_S` sends them as one batch on
:func:`notebook_topic` (not the store's topic: the notebook subscribes to that
one and would hear its own events back). Events delivered from the servers'
batches arrive on the Dask client's loop thread and are not sent again.
"""

from __future__ import annotations

import contextlib
import pickle
import threading
from typing import Any

from ..cluster._event_relay import RANK_FLUSH_S, pack_batch
from ..cluster._transport.dask import on_client_loop
from ..events import Event
from ._plugin import INFO_TOPIC

__all__ = ["NOTEBOOK_PREFIX", "Forward", "notebook_topic", "store_info"]

NOTEBOOK_PREFIX = "labkv-notebook-"


def notebook_topic(store_id: str) -> str:
    """The topic of a watched store's own events.

    >>> notebook_topic("dist_sync-1")
    'labkv-notebook-dist_sync-1'
    """
    return f"{NOTEBOOK_PREFIX}{store_id}"


def store_info(kv: Any) -> dict[str, Any]:
    """What the pages say of ``kv``: type, ranks, servers, replicas, placement."""
    spec = kv.spec
    return {
        "store": kv.store_id,
        "type": kv.type,
        "num_workers": kv.num_workers,
        "num_servers": kv.num_servers,
        "replicas": spec.replicas,
        "placement": kv.placement(),
    }


class Forward:
    """The subscriber :func:`labkv.dashboard.watch` puts on a store's bus, and
    the thread that sends what it collected (:meth:`close` sends the rest)."""

    def __init__(self, kv: Any, interval: float = RANK_FLUSH_S):
        self.kv, self.client = kv, kv.handle.client
        self.topic = notebook_topic(kv.store_id)
        self.interval = interval
        self._lock = threading.Lock()
        self._buffer: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="labkv-watch", daemon=True)
        self._keys = -1  # keys the pages were told the placement of

    def __call__(self, event: Event) -> None:
        """The bus subscriber: keeps the store's own events only."""
        if on_client_loop(self.client):
            return  # a batch of the servers' or the ranks' events, sent by them already
        data = event.to_dict()
        with self._lock:
            self._buffer.append(data)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.send()

    def send(self) -> None:
        """Send what was collected (after the calls the bus only counted)."""
        with contextlib.suppress(Exception):  # a closed store's bus
            self.kv.events.flush()
        with self._lock:
            batch, self._buffer = self._buffer, []
        keys = len(getattr(self.kv, "_meta", ()))
        if keys != self._keys:  # new keys: the pages learn where they live
            self._keys = keys
            with contextlib.suppress(Exception):
                self.client.log_event(INFO_TOPIC, pickle.dumps(store_info(self.kv)))
        if batch:
            with contextlib.suppress(Exception):  # the scheduler may be gone
                self.client.log_event(self.topic, pack_batch(batch))

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.send()
