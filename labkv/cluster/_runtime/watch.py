"""The helpers of ``run``'s watcher (:class:`~.run.Run`): what wakes it, how it
gathers a finished rank's result, and how it stops the ranks.

While the ranks run, the watcher looks at the cluster's workers as soon as a
rank ends or the scheduler removes a rank's worker (its ``remove-worker``
event, :class:`_Wakeup`), and every ``_POLL_S`` in any case: a rank that
failed, or a lost worker hosting a rank or a server fails the run at once (or
has the rank replaced, ``on_rank_loss="replace"``, or dropped, ``"shrink"``:
its result is None; see :mod:`.elastic`). Stopping (:func:`_stop_ranks`,
:func:`_abort`) bars the run's senders on every server, so that a stopped
rank's later calls are refused, and cancels the rank tasks.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import distributed

from ..._call.interrupts import sigint_held
from .._options import StoreSpec
from .._transport.dask import ActorLink, actor_address
from .connect import ClusterHandle
from .elastic import Replacer

_POLL_S = 0.25
# How long one look at a finished rank's result waits before asking whether the
# worker holding it is still alive.
_RESULT_WAIT_S = 1.0
# How long an interrupted run waits for its ranks' threads to end (their next call
# to a server fails; a rank busy computing ends at its next call, later).
_STOP_S = 10.0
# How long a failed run waits for its servers to acknowledge the abort, in all.
_ABORT_S = 1.0


def _abort(client: distributed.Client, spec: StoreSpec, servers: list[Any], reason: str) -> None:
    """Wake every waiting rank with an error, and have the servers refuse this
    run's ranks from now on (best effort: servers may be gone)."""
    calls = []
    for s, actor in enumerate(servers):  # with replicas: every replica, replica-major
        address = actor_address(actor) or spec.server_addresses[s % spec.num_servers]
        with contextlib.suppress(Exception):  # its worker may be gone
            calls.append(ActorLink(s, address, actor).call("abort", reason, spec.group))
    # One short deadline for all: a frozen server cannot be woken, and must not
    # delay the error beyond the run's documented bound (timeout + GRACE_S).
    deadline = time.monotonic() + _ABORT_S
    for call in calls:
        with contextlib.suppress(Exception):
            call.result(timeout=max(0.05, deadline - time.monotonic()))


def _ranks_running(keys: list[str], dask_worker: Any = None) -> list[str]:
    """The rank tasks among ``keys`` whose thread still runs on ``dask_worker``
    (a cancelled task's thread runs on: Dask cannot stop a thread)."""
    return [k for k in keys if k in dask_worker.active_keys]


def _stop_ranks(
    handle: ClusterHandle,
    spec: StoreSpec,
    servers: list[Any],
    futures: list[Any],
    rank_workers: list[str],
    why: str,
) -> None:
    """An interrupted run: the servers refuse its ranks (each fails at its next
    call), they are cancelled, and this waits (at most ``_STOP_S``) until no
    rank's thread runs any more, so that none writes to a shared store after
    ``run`` returns (each call the servers refuse fails its rank)."""
    client = handle.client
    with sigint_held:  # a second Ctrl-C must not leave the ranks half stopped
        _abort(client, spec, servers, f"the run was interrupted ({why})")
        client.cancel(futures)
    keys = [f.key for f in futures]
    deadline = time.monotonic() + _STOP_S
    while time.monotonic() < deadline:
        try:
            live = set(handle.workers())  # a lost rank's worker has no thread to wait for
            workers = [w for w in dict.fromkeys(rank_workers) if w in live]
            if not workers:
                return
            running = client.run(_ranks_running, keys, workers=workers, on_error="return")
        except Exception:  # workers gone: their ranks with them
            return
        running = {w: r for w, r in running.items() if not isinstance(r, BaseException)}
        if not any(running.values()):
            return
        time.sleep(_POLL_S)


def _result_of(future: Any, alive: Callable[[], bool]) -> tuple[bool, Any]:
    """``(True, result)`` of a finished rank's ``future``, or ``(False, None)``
    when its worker died before the result reached this process. The result
    lives on that worker until gathered: lost with it, a task pinned to the dead
    worker is never computed again, and ``Future.result()`` would wait forever."""
    while True:
        try:
            return True, future.result(timeout=_RESULT_WAIT_S)
        except distributed.TimeoutError:
            if not alive():
                return False, None


def _warn_if_replays_differed(replace: Replacer) -> None:
    """A replaced rank whose replayed steps pushed other bits: say so (the run
    goes on with the first pushes, but is not bit-identical to an undisturbed one)."""
    try:
        mismatches = replace.replay_mismatches()
    except Exception:  # a server lost at the very end: nothing to report from it
        return
    if mismatches:
        ranks = sorted({record["rank"] for record in replace.history})
        warnings.warn(
            f"the replacement of rank(s) {ranks} pushed other bits than the lost "
            f"incarnation for {mismatches} replayed (key, rank, step) push(es): its "
            "step does not compute the same on the replacement (randomness not from "
            "step.rng, state kept across steps, another device), so the run is not "
            "bit-identical to an undisturbed one (the first pushes were kept)",
            RuntimeWarning,
            stacklevel=5,  # the caller of run (via Run.execute and Run.watch)
        )


class _Wakeup:
    """What wakes the watcher before its next look: a rank's future that is done,
    or the scheduler's ``remove-worker`` event of a rank's worker (logged on the
    worker's own topic, pushed to this client within milliseconds)."""

    def __init__(self, client: distributed.Client) -> None:
        self.client, self.event, self.topics = client, threading.Event(), set()

    def future(self, future: Any) -> None:
        future.add_done_callback(lambda _: self.event.set())

    def worker(self, address: str) -> None:
        if address not in self.topics:
            self.topics.add(address)
            self.client.subscribe_topic(address, self._heard)

    def _heard(self, event: Any) -> None:
        _, msg = event
        if isinstance(msg, dict) and msg.get("action") == "remove-worker":
            self.event.set()

    def wait(self, timeout: float) -> None:
        self.event.wait(timeout)
        self.event.clear()

    def close(self) -> None:
        for topic in self.topics:
            with contextlib.suppress(Exception):  # the scheduler may be gone
                self.client.unsubscribe_topic(topic)
