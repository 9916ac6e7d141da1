"""What runs on a worker as one rank of :func:`labkv.cluster.run`: the rank's
task (:func:`rank_main`: build its store, run the function, flush), its events
streamed to the notebook, and a filter that keeps Dask from logging a failed
rank a second time (``run`` raises it in the caller, naming the rank)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from .. import _event_relay
from .._event_relay import EventStream, topic_of
from .._options import StoreSpec
from .._rank.dist_store import DistStore
from .._transport.dask import worker_loop
from .links import new_store
from .progress import step_reporter

# A call onto the rank's own worker loop (never waits on another process).
LOOP_CALL_S = 10.0


def rank_main(
    fn: Callable,
    spec: StoreSpec,
    servers: list[Any],
    rank: int,
    num_workers: int,
    owner: bool,
    args: tuple,
    kwargs: dict,
    detail: tuple[float, int] | None = None,
    incarnation: int = 0,
    inits_new_keys: bool = False,
    progress: str | None = None,
) -> Any:
    """The task of one rank (its ``incarnation``-th replacement, 0: the first):
    build its store, run ``fn``, wait for its pushes. With ``detail`` (the
    notebook's subscribers' ``(detail_interval, detail_burst)``), the rank's
    events go to the store's topic meanwhile; ``inits_new_keys``: rank 0 of a
    run on the notebook's store (it initialises the keys the notebook has not)."""
    quiet_rank_failures()
    kv = new_store(
        spec,
        servers,
        rank,
        num_workers,
        owner=owner,
        inits_new_keys=inits_new_keys,
        incarnation=incarnation,
    )
    if progress is not None:  # the run's topic of the ranks' steps
        kv._steps.hooks.append(step_reporter(rank, progress, kv._steps))
    stop_stream = stream_events(kv, *detail) if detail is not None else None
    try:
        result = fn(kv, *args, **kwargs)
        kv.flush()
    finally:
        if stop_stream is not None:
            # Events are best effort: the rank's own outcome (or error) is what counts.
            with contextlib.suppress(Exception):
                stop_stream()
    return result


RANK_KEY = "labkv-rank-"  # the Dask key of every rank task starts with it


class RankFailureFilter(logging.Filter):
    """Drops the worker's "Compute Failed" record of a rank task: ``run`` raises that
    error in the caller, naming the rank; Dask's record would print it again, as an
    escaped one-line traceback, under whichever notebook cell is running."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not (msg.startswith("Compute Failed") and RANK_KEY in str(record.args))


def quiet_rank_failures() -> None:
    """Install :class:`RankFailureFilter` on this worker's logger, once."""
    logger = logging.getLogger("distributed.worker")
    if not any(isinstance(f, RankFailureFilter) for f in logger.filters):
        logger.addFilter(RankFailureFilter())


def stream_events(kv: DistStore, detail_interval: float, detail_burst: int) -> Callable[[], None]:
    """Send a rank's events to its store's topic, batched on the worker's loop
    (as a server's are); returns the function that sends the rest and stops."""
    from distributed import get_worker

    worker = get_worker()
    topic = topic_of(kv.store_id)

    def send(batch: bytes) -> None:
        worker.log_event(topic, batch)

    stream = EventStream(kv.events, send, interval=_event_relay.RANK_FLUSH_S)
    loop = worker_loop(worker)

    async def start() -> None:
        stream.start(detail_interval, detail_burst)

    async def stop() -> None:
        stream.stop()

    asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=LOOP_CALL_S)
    return lambda: asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=LOOP_CALL_S)
