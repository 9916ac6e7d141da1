"""The Dask scheduler as the links and the driver see it: whether a client's
scheduler is gone, and why (:func:`scheduler_gone`; Dask's workers stop with
it, and every server with them), and a store's event topic dropped from it
(:func:`forget_topic`)."""

from __future__ import annotations

from typing import Any

from .._errors import ClusterError


def scheduler_gone(client: Any) -> str | None:
    """Why ``client`` has no scheduler any more (its connection broke and it is
    reconnecting, or it closed), or None."""
    status = client.status
    if status in ("connecting", "closing", "closed", "failed"):
        return _gone(client, f"the client is {status}")
    return None


def _gone(client: Any, why: str) -> str:
    address = getattr(getattr(client, "scheduler", None), "address", None) or "its address"
    return (
        f"the Dask scheduler at {address} is gone ({why}): Dask's workers stop with their "
        "scheduler, and every server's values and optimizer states with them; start the "
        "cluster again and resume from a checkpoint"
    )


def raise_if_scheduler_gone(client: Any) -> None:
    """Raise :class:`ClusterError` naming the scheduler when it is gone."""
    why = scheduler_gone(client)
    if why is not None:
        raise ClusterError(why)


# -- the scheduler's event topics ------------------------------------------------------
#: When :func:`forget_topic` looks again: a server's last batch may still be on
#: its way (workers send events to the scheduler on their own batched stream).
FORGET_AGAIN_S = (0.5, 2.0)


def forget_topic(topic: str, dask_scheduler: Any = None) -> bool:
    """Drop ``topic``'s events from the scheduler while nobody subscribes to it,
    now and again after :data:`FORGET_AGAIN_S` (run there by
    ``client.run_on_scheduler``). The scheduler keeps up to 1000 batches of
    every topic it ever saw, and nothing else removes them: without this, each
    watched store left its last batches there for good. Whether it was dropped now."""
    for delay in FORGET_AGAIN_S:
        dask_scheduler.loop.call_later(delay, _drop_topic, dask_scheduler, topic)
    return _drop_topic(dask_scheduler, topic)


def _drop_topic(dask_scheduler: Any, topic: str) -> bool:
    topics = getattr(getattr(dask_scheduler, "_broker", None), "_topics", None)
    if topics is None or topic not in topics or topics[topic].subscribers:
        return False
    del topics[topic]
    return True
