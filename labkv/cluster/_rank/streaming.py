"""The server events of a notebook's :class:`~labkv.cluster._rank.dist_store.DistStore`: its servers
stream their events to the store's topic while its event bus has subscribers
(a monitor), and stop when the last one leaves. This process hears the topic
only while a subscriber wants those events here: a dashboard's watch does not
(the scheduler folds them), so a store only it watches costs this process nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from .._errors import ClusterError
from .._event_relay import ClusterBus, topic_of
from .._transport.base import ServerLink
from .._transport.dask import on_client_loop
from .._transport.scheduler import forget_topic
from .calls import Calls

__all__ = ["Streaming"]


class Streaming:
    """The event stream of the notebook's store ``store_id``: its ``bus``
    (the store's ``events``) turns its servers' streaming on and off through
    ``calls``, on the Dask ``client``'s topic of the store; ``timeout``
    bounds a new primary's answer (:meth:`promoted`)."""

    def __init__(self, client: Any, store_id: str, calls: Calls, timeout: float):
        self.client, self.store_id, self.calls, self.timeout = client, store_id, calls, timeout
        self.bus = ClusterBus(store_id, self.set)
        self.streamed = False  # its servers ever streamed events (see close)
        self.hearing = False  # this process subscribes to the store's topic

    def _detail(self) -> tuple[float, int]:
        return self.bus.detail_interval, self.bus.detail_burst

    def set(self, on: bool, hear: bool = True) -> None:
        """Stream the servers' events (``on``), or stop them (the bus's callback);
        ``hear``: deliver them to this process's bus too."""
        if not on:
            self._stop()
            return
        self.streamed = True
        self._hear(hear)
        calls = self.calls
        sent = [
            (s, calls.call(s, "streaming", True, *self._detail())) for s in range(len(calls.links))
        ]
        # Wait, so that the next push is streamed; but never on the client's own
        # loop thread (a subscriber added from an event handler): that would deadlock.
        if not on_client_loop(self.client):
            calls.wait(sent, "streaming")

    def _hear(self, hear: bool) -> None:
        if hear and not self.hearing:
            self.client.subscribe_topic(topic_of(self.store_id), self.bus.receive)
        elif not hear and self.hearing:
            with contextlib.suppress(ValueError):  # close() already unsubscribed
                self.client.unsubscribe_topic(topic_of(self.store_id))
        self.hearing = hear

    def _stop(self) -> None:
        """Stop the servers' events. After :meth:`close` there is nothing to stop;
        with a server lost, every live server is told first, then the loss is
        raised (the bus has dropped the subscriber by then)."""
        self._hear(False)
        if self.calls.closed:
            return
        lost: list[BaseException] = []
        for s in range(len(self.calls.links)):
            try:
                call = self.calls.call(s, "streaming", False)
                if not on_client_loop(self.client):
                    self.calls.wait([(s, call)], "streaming")
            except (ClusterError, OSError) as exc:
                lost.append(exc)
        self.forget()
        if lost:
            raise lost[0]

    def forget(self) -> None:
        """Drop this store's events from the scheduler (best effort: see
        :func:`labkv.cluster._transport.scheduler.forget_topic`)."""
        if on_client_loop(self.client):
            return
        with contextlib.suppress(Exception):  # the scheduler may be gone
            self.client.run_on_scheduler(forget_topic, topic_of(self.store_id))

    def promoted(self, primary: ServerLink) -> None:
        """A new primary streams its events (while the bus is watched) before
        the pushes not yet acknowledged are replayed to it, so that the
        monitor counts them too."""
        if not self.bus.active:
            return
        with contextlib.suppress(Exception):  # failed_over tries again after the replay
            primary.call("streaming", True, *self._detail()).result(self.timeout)

    def failed_over(self) -> None:
        """After a failover: the new primary streams too (while the bus is watched)."""
        if self.bus.active:
            self.set(True, self.bus.remote)

    def close(self, release: Callable[[], None]) -> None:
        """Stop hearing the store's events, ``release()`` its servers, then drop
        the events they left on the scheduler."""
        self._hear(False)
        release()
        if self.streamed:
            self.forget()
