"""The server events of a notebook's :class:`~labkv.cluster._rank.store.DistStore`: its servers
stream their events to the store's topic while its event bus has subscribers
(a monitor), and stop when the last one leaves."""

from __future__ import annotations

import contextlib

from .._errors import ClusterError
from .._events import forget_topic, topic_of
from .._transport.dask import on_client_loop

__all__ = ["StoreStreaming"]


class StoreStreaming:
    """:class:`~labkv.cluster._rank.store.DistStore` methods; they use its ``_handle`` (the
    notebook's cluster handle), ``_id``, ``events``, ``_calls``, ``_streamed``,
    ``num_servers`` and its ways of calling the servers."""

    def _set_streaming(self, on: bool) -> None:
        if not on:
            self._stop_streaming()
            return
        client = self._handle.client
        self._streamed = True
        client.subscribe_topic(topic_of(self._id), self.events.receive)
        detail = (self.events.detail_interval, self.events.detail_burst)
        calls = [(s, self._call(s, "streaming", True, *detail)) for s in range(self.num_servers)]
        # Wait, so that the next push is streamed; but never on the client's own
        # loop thread (a subscriber added from an event handler): that would deadlock.
        if not on_client_loop(client):
            self._wait_all(calls, "streaming")

    def _stop_streaming(self) -> None:
        """Stop the servers' events. After :meth:`close` there is nothing to stop;
        with a server lost, every live server is told first, then the loss is
        raised (the bus has dropped the subscriber by then)."""
        client = self._handle.client
        with contextlib.suppress(ValueError):  # close() already unsubscribed
            client.unsubscribe_topic(topic_of(self._id))
        if self._calls.closed:
            return
        lost: list[BaseException] = []
        for s in range(self.num_servers):
            try:
                call = self._call(s, "streaming", False)
                if not on_client_loop(client):
                    self._wait_all([(s, call)], "streaming")
            except (ClusterError, OSError) as exc:
                lost.append(exc)
        self._forget_topic()
        if lost:
            raise lost[0]

    def _forget_topic(self) -> None:
        """Drop this store's events from the scheduler (best effort: see
        :func:`._events.forget_topic`)."""
        client = self._handle.client
        if on_client_loop(client):
            return
        with contextlib.suppress(Exception):  # the scheduler may be gone
            client.run_on_scheduler(forget_topic, topic_of(self._id))
