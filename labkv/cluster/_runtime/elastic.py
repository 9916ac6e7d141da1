"""Replacing a lost rank mid-run, ``run(..., on_rank_loss="replace")``, or
going on without it, ``on_rank_loss="shrink"``.

When a worker that runs a rank is lost, the watcher (:meth:`~.run.Run.replace_lost`)
hands the rank to :class:`Replacer`, which

1. fences the lost incarnation on every server replica (its late calls are
   refused: a frozen or cut-off process must not change the store) and holds
   the servers' waits (the rounds it holds up wait for its replacement rather
   than time out); the servers answer where the rank resumes;
2. refuses to go on when the rank was lost more than ``max_restarts`` times,
   or three times at the same step (itself, then its replacement twice: a
   step that kills its worker every time is a crash, not a lost worker);
3. starts the rank's next incarnation on a worker that runs no rank (a spare,
   or the lost worker once its nanny has restarted it, which joins under a new
   address), waiting at most ``replace_timeout`` seconds for one.

The replacement builds its store as the next incarnation of the rank, and its
step loops start where the rank was lost (:mod:`labkv.cluster._rank.steps`);
the live ranks see their rounds complete.

Shrinking (dist_async and dist_ssp only: a dist_sync round sums every rank's
push) fences the lost rank for good on every server replica, whose barriers,
dist_ssp clocks and sliced updates then go on without it
(:func:`~labkv.cluster._server.control.go_on_without`); the rank's result is
None, and the rest of its partition is not trained on.

Each loss and replacement, or drop, is an event on a shared store's bus
(``rank-lost`` and ``rank-replaced``, or ``rank-dropped``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from ..._call.interrupts import sigint_held
from ..._logger import logger
from .._errors import ClusterError
from .._options import StoreSpec
from .._transport.dask import ActorLink, actor_address

#: What ``run`` does when a rank's worker is lost.
ON_RANK_LOSS = ("fail", "replace", "shrink")

# How often a replacement waits for a free worker to join.
_PLACE_POLL_S = 0.1


def check_on_rank_loss(on_rank_loss: Any, max_restarts: Any, replace_timeout: Any) -> None:
    """Refuse a value ``run`` cannot act on, before anything starts."""
    if on_rank_loss not in ON_RANK_LOSS:
        raise ValueError(f"on_rank_loss must be one of {list(ON_RANK_LOSS)}, got {on_rank_loss!r}")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be a non-negative int, got {max_restarts!r}")
    number = isinstance(replace_timeout, (int, float)) and not isinstance(replace_timeout, bool)
    if not number or replace_timeout <= 0:
        raise ValueError(
            f"replace_timeout must be a positive number of seconds, got {replace_timeout!r}"
        )


def check_shrink(on_rank_loss: str, sync: bool) -> None:
    """Refuse ``on_rank_loss="shrink"`` for a dist_sync store (``sync``)."""
    if on_rank_loss == "shrink" and sync:
        raise ValueError(
            "on_rank_loss='shrink' needs a dist_async or dist_ssp store: a dist_sync round "
            "sums every rank's push, so going on without one would change every sum "
            "(on_rank_loss='replace' keeps a dist_sync run bit-identical)"
        )


class Replacer:
    """Replaces the lost ranks of one run (see module doc). ``submit(rank,
    incarnation, worker, spec)`` starts a rank's task on the servers of ``spec``; ``workers()`` lists the
    cluster's live workers; ``links`` are the watcher's replicated links (none
    without replicas: ``servers`` are then reached by their actors);
    ``emit(op, **fields)`` reports an event (a shared store's bus)."""

    def __init__(
        self,
        spec: StoreSpec,
        servers: list[Any],
        links: list[Any],
        submit: Callable[[int, int, str, StoreSpec], Any],
        workers: Callable[[], list[str]],
        emit: Callable[..., Any],
        max_restarts: int,
        replace_timeout: float,
        shrink: bool = False,
    ) -> None:
        self.spec, self.servers, self.links = spec, servers, links
        self.submit, self.workers, self.emit = submit, workers, emit
        self.max_restarts, self.replace_timeout = max_restarts, replace_timeout
        self.shrink = shrink  # go on without a lost rank instead of replacing it
        self.dropped: list[int] = []
        self.started: list[tuple[Any, str]] = []  # (future, worker) of each replacement
        self.incarnations: dict[int, int] = {}
        self.lost_at: dict[tuple[int, int], int] = {}  # (rank, step) -> losses there
        self.history: list[dict[str, Any]] = []  # one record per replacement

    def replace(self, rank: int, lost_worker: str, busy: set[str]) -> tuple[Any, str]:
        """Start rank ``rank``'s next incarnation (its worker ``lost_worker`` is
        gone; ``busy``: the workers of the other ranks still running); its
        future and worker."""
        started = time.monotonic()
        incarnation = self.incarnations.get(rank, 0)
        resume = self._fence(rank, incarnation)
        self.emit("rank-lost", rank=rank, extra={"worker": lost_worker, "step": resume})
        logger.warning("rank %d lost with Dask worker %s at step %s", rank, lost_worker, resume)
        if incarnation + 1 > self.max_restarts:
            raise ClusterError(
                f"rank {rank} was lost {incarnation + 1} times (on_rank_loss='replace', "
                f"max_restarts={self.max_restarts}); last on Dask worker {lost_worker}"
            )
        losses = self.lost_at.get((rank, resume), 0) + 1
        self.lost_at[(rank, resume)] = losses
        if losses > 2:  # the rank, then twice its replacement, at the same step
            raise ClusterError(
                f"rank {rank} was lost {losses} times at step {resume} (its replacement "
                f"twice; last on Dask worker {lost_worker}): a step that kills its worker "
                "every time is a crash, not a lost worker, so it is not replaced again"
            )
        worker = self._place(rank, lost_worker, busy)
        self.incarnations[rank] = incarnation + 1
        spec = self._current_spec()
        with sigint_held:  # a Ctrl-C now must still find the replacement to stop
            future = self.submit(rank, incarnation + 1, worker, spec)
            self.started.append((future, worker))
        record = {
            "worker": worker,
            "lost_worker": lost_worker,
            "incarnation": incarnation + 1,
            "step": resume,
            "seconds": round(time.monotonic() - started, 3),
        }
        self.history.append({"rank": rank, **record})
        self.emit("rank-replaced", rank=rank, extra=record)
        logger.info(
            "rank %d replaced on Dask worker %s (incarnation %d), resuming at step %s",
            rank,
            worker,
            incarnation + 1,
            resume,
        )
        return future, worker

    def drop(self, rank: int, lost_worker: str, ranks: int) -> None:
        """Go on without rank ``rank`` (its worker ``lost_worker`` is gone) of the
        run's ``ranks``: fenced for good on every server replica, whose waits
        go on without it. Losing the last rank fails the run."""
        step = self._fence(rank, self.incarnations.get(rank, 0), run=self.spec.group)
        self.dropped.append(rank)
        live = ranks - len(self.dropped)
        if live == 0:
            raise ClusterError(
                f"every rank was lost (the last, rank {rank}, on Dask worker {lost_worker}): "
                "on_rank_loss='shrink' has no rank left to go on with"
            )
        extra = {"worker": lost_worker, "step": step, "ranks_left": live}
        self.emit("rank-dropped", rank=rank, extra=extra)
        logger.warning(
            "rank %d dropped (Dask worker %s lost); %d ranks go on", rank, lost_worker, live
        )

    def _current_spec(self) -> StoreSpec:
        """The run's spec with the replicas of now: the lost worker's are gone, a
        replica seeded since is in (a call to a dead replica would sit in
        Dask's connect retries)."""
        if not self.links:
            return self.spec
        live = set(self.workers())  # a primary may list a dead backup until it forwards again
        members = [[tuple(m) for m in link.members if m.address in live] for link in self.links]
        return dataclasses.replace(self.spec, replica_members=members)

    def _fence(self, rank: int, incarnation: int, run: str | None = None) -> int | None:
        """Fence incarnation ``incarnation`` of ``rank`` on every server replica
        (``run``: for good, the servers go on without it); the step it resumes
        at (None: it pushed nothing in a step loop)."""
        prefix = f"{self.spec.group}/{rank}.{incarnation}/"
        steps = []
        for call in self._on_every_server("fence", prefix, rank, self.replace_timeout, run):
            try:
                steps.append(call.result(timeout=self.spec.timeout))
            except Exception as exc:
                raise ClusterError(
                    f"rank {rank} was lost, and its servers could not be told to refuse its "
                    f"lost incarnation ({type(exc).__name__}: {exc}); the run stops"
                ) from exc
        found = [s for s in steps if s is not None]
        return min(found) if found else None

    def replay_mismatches(self) -> int:
        """How many replayed pushes the servers found other bits in than the lost
        incarnation's push of the same (key, rank, step) (the step does not compute
        the same on the replacement: the run is not bit-identical)."""
        loads = [call.result(timeout=self.spec.timeout) for call in self._on_every_server("load")]
        return sum(load["replay_mismatches"] for load in loads)

    def _on_every_server(self, method: str, *args: Any) -> list[Any]:
        """Call ``method`` on every server (its primary, with replicas)."""
        if self.links:
            return [link.call(method, *args) for link in self.links]
        calls = []
        for s, actor in enumerate(self.servers):
            address = actor_address(actor) or self.spec.server_addresses[s]
            calls.append(ActorLink(s, address, actor).call(method, *args))
        return calls

    def _place(self, rank: int, lost_worker: str, busy: set[str]) -> str:
        """A live worker that runs no rank, waiting for one to join (a nanny's
        restart) at most ``replace_timeout`` seconds."""
        deadline = time.monotonic() + self.replace_timeout
        while True:
            with contextlib.suppress(Exception):  # the scheduler may be busy removing it
                free = [w for w in self.workers() if w not in busy and w != lost_worker]
                if free:
                    return free[0]
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"rank {rank} was lost with Dask worker {lost_worker}, and no worker "
                    f"without a rank joined within replace_timeout={self.replace_timeout:g} s "
                    "to replace it: start the cluster with a spare worker (one more than "
                    "the ranks), or one whose workers a nanny restarts"
                )
            time.sleep(_PLACE_POLL_S)
