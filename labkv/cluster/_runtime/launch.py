"""Starting a store's servers on Dask workers.

- :class:`DaskServer`: a server actor whose host is its worker.
- :func:`start_servers`: the server actors of a new store, pinned to workers.
- :func:`start_server`: one of them (or a new replica, see ``reseed``).
- :func:`check_cluster_args`: the checks made before anything starts.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from typing import Any

import distributed

from ..._logger import logger
from ..._types import SYNC_KINDS
from .._errors import TIMEOUTS, ClusterError
from .._event_relay import topic_of
from .._options import (
    StoreSpec,
)
from .._placement import DEFAULT_BIGARRAY_BOUND
from .._server.actor import Server
from .._transport.dask import DaskHost
from .connect import ClusterHandle
from .waits import announced

# How often a start that waits on its servers asks the scheduler whether their
# workers are still there (a task pinned to a lost worker never runs, and a call
# to one can sit in Dask's connect retries for 30 s).
_LIVE_POLL_S = 0.5


class DaskServer(Server):
    """A :class:`Server` as a Dask actor: its host is the worker that runs it (the
    server itself knows nothing of Dask, so tests run it in-process)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args, host=DaskHost())


def check_cluster_args(cluster: Any, timeout: Any) -> None:
    """Refuse a ``cluster`` that is not a handle and a ``timeout`` that is not
    a positive number of seconds, before anything starts."""
    if cluster is not None and not isinstance(cluster, ClusterHandle):
        hint = f" (connect to it first: labkv.cluster.connect({cluster!r}))"
        raise TypeError(
            f"cluster must be a ClusterHandle from labkv.cluster.connect, got "
            f"{type(cluster).__name__}{hint if isinstance(cluster, str) else ''}"
        )
    number = isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
    if not number or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")


def start_servers(
    handle: ClusterHandle,
    kind: str,
    num_servers: int,
    num_workers: int,
    timeout: float,
    workers: list[str] | None = None,
    device: str = "auto",
    bigarray_bound: int = DEFAULT_BIGARRAY_BOUND,
    store_id: str | None = None,
    name: str | None = None,
    staleness: int | None = None,
    replicas: int = 1,
) -> tuple[list[Any], list[Any], StoreSpec]:
    """Start ``num_servers`` server actors of a new store (``store_id``, made
    from ``kind`` by default) round-robin on ``workers`` (default: all, sorted),
    keeping their values on ``device`` (see :mod:`labkv.cluster._device`);
    ``(futures, actors, spec)``; ``name`` is the type name the user gave,
    ``staleness`` a dist_ssp store's bound.

    With ``replicas`` R > 1 each server id has R actors on R different workers
    (replica r of server s on worker ``s + r``, round-robin), the first its
    primary; ``actors`` are then the primaries, and ``spec.replica_members``
    names them all. Actors are pinned (``allow_other_workers=False``): a server's keys live in
    its worker's memory, so Dask must never move or re-run it elsewhere. A
    server that cannot start (no GPU for ``device='gpu'``), or does not start
    within ``timeout`` (its worker too busy), fails the call, and the servers
    already started are released. A worker that leaves the cluster meanwhile
    fails the call as soon as the scheduler has dropped it (within
    ``_LIVE_POLL_S`` of that), naming the worker: nothing was initialised yet,
    so making the store again loses nothing, and the servers are not moved
    to other workers behind the caller's back (the placement above is the
    documented one, and ``run`` places its ranks on the same workers).
    """
    client = handle.client
    store_id = store_id or f"{kind}-{uuid.uuid4().hex[:8]}"
    workers = workers or handle.workers()
    if not workers:
        raise ClusterError("the Dask cluster has no workers to host servers")
    if replicas > len(workers):
        raise ClusterError(
            f"replicas={replicas} needs {replicas} Dask workers (each replica of a server "
            f"on its own); the cluster has {len(workers)}: {workers}"
        )
    addresses = [workers[s % len(workers)] for s in range(num_servers)]
    where = [
        (s, r, workers[(s + r) % len(workers)]) for r in range(replicas) for s in range(num_servers)
    ]
    futures = [
        start_server(handle, store_id, kind, s, num_workers, timeout, device, staleness, address, r)
        for s, r, address in where
    ]
    # The Actor handles bind to "the current client" when they are made; the
    # handle's client need not be Dask's default one (set_as_default=False).
    copies = f" x {replicas} replicas" if replicas > 1 else ""
    on = f"{len(workers)} worker" + ("s" if len(workers) > 1 else "")
    starting = f"starting {num_servers} servers{copies} of {kind} on {on}"
    with client.as_current(), announced(starting):
        try:
            _wait_started(handle, futures, where, store_id, timeout)
            actors = client.gather(futures)
            devices = [actor.device_name for actor in actors[:num_servers]]
            peers = [(addresses[s], futures[s].key) for s in range(num_servers)]
            calls = [actor.link(peers) for actor in actors]
            members = [
                [(a, futures[i].key) for i, (t, _, a) in enumerate(where) if t == s]
                for s in range(num_servers)
            ]
            if replicas > 1:
                for call, (_, _, address) in zip(calls, where):
                    _answer(handle, call.result, address, store_id, timeout)
                calls = [actor.join_group(members[s], r) for actor, (s, r, _) in zip(actors, where)]
            for call, (_, _, address) in zip(calls, where):
                _answer(handle, call.result, address, store_id, timeout)
        except ClusterError:
            client.cancel(futures)
            raise
        except Exception as exc:
            client.cancel(futures)
            lost = sorted({a for _, _, a in where} - set(handle.workers()))
            if lost:  # a call to a server whose worker died fails with a broken comm
                raise _lost_error(handle, lost, "servers had started", store_id) from exc
            raise ClusterError(f"the servers of {store_id} could not start: {exc}") from exc
    spec = StoreSpec(
        kind,
        store_id,
        num_servers,
        addresses,
        int(bigarray_bound),
        float(timeout),
        server_devices=devices,
        name=name or kind,
        staleness=staleness,
        replicas=replicas,
        replica_members=members if replicas > 1 else [],
    )
    logger.info(
        "store %s: %d %s server(s) started on %s (replicas %d)",
        store_id,
        num_servers,
        kind,
        ", ".join(addresses),
        replicas,
    )
    return futures, actors, spec


def _lost_error(handle: ClusterHandle, lost: list[str], what: str, store_id: str) -> ClusterError:
    return ClusterError(
        f"Dask worker(s) {lost} are not in the cluster any more (lost while the servers of "
        f"{store_id} started: {what} there); nothing was kept: make the store again (the "
        f"cluster's workers now: {handle.workers()})"
    )


def _wait_started(
    handle: ClusterHandle,
    futures: list[Any],
    where: list[tuple[int, int, str]],
    store_id: str,
    timeout: float,
) -> None:
    """Wait until every server actor of ``futures`` (server, replica, worker
    of each in ``where``) has started, at most ``timeout`` seconds; one whose
    worker the scheduler no longer lists fails the start within
    ``_LIVE_POLL_S``, naming that worker."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            distributed.wait(futures, timeout=max(0.01, min(_LIVE_POLL_S, left)))
            return
        except TIMEOUTS:
            pass
        late = [i for i, f in enumerate(futures) if f.status == "pending"]
        live = set(handle.workers())
        lost = sorted({where[i][2] for i in late} - live)
        if lost:
            pinned = [(s, r) for s, r, a in where if a in lost]
            what = f"servers {_named(pinned)} were to start"
            raise _lost_error(handle, lost, what, store_id)
        if time.monotonic() >= deadline:
            raise ClusterError(
                f"servers {_named([where[i][:2] for i in late])} of {store_id} did not start "
                f"within {timeout:g} s on Dask worker(s) {sorted({where[i][2] for i in late})} "
                "(too busy?)"
            )


def _named(pieces: list[tuple[int, int]]) -> str:
    """Server ids, and their replicas beyond the primary: ``[0, 1 (replica 1)]``."""
    return "[" + ", ".join(f"{s}" if r == 0 else f"{s} (replica {r})" for s, r in pieces) + "]"


def _answer(
    handle: ClusterHandle,
    result: Callable[..., Any],
    address: str,
    store_id: str,
    timeout: float,
) -> Any:
    """``result(timeout=...)`` of a call to the server on ``address``, looking
    every ``_LIVE_POLL_S`` whether the scheduler still lists that worker."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return result(timeout=max(0.01, min(_LIVE_POLL_S, deadline - time.monotonic())))
        except TIMEOUTS:
            if address not in handle.workers():
                raise _lost_error(handle, [address], "a server had started", store_id) from None
            if time.monotonic() >= deadline:
                raise


def start_server(
    handle: ClusterHandle,
    store_id: str,
    kind: str,
    sid: int,
    num_workers: int,
    timeout: float,
    device: str,
    staleness: int | None,
    address: str,
    replica: int = 0,
) -> Any:
    """The future of one server actor (``replica`` r > 0: a backup of server
    ``sid``), pinned to the worker at ``address``."""
    suffix = "" if replica == 0 else f"-r{replica}"
    return handle.client.submit(
        DaskServer,
        sid,
        store_id,
        num_workers,
        kind in SYNC_KINDS,
        timeout,
        topic_of(store_id),
        device,
        staleness,
        actor=True,
        workers=[address],
        allow_other_workers=False,
        pure=False,
        key=f"labkv-server-{store_id}-{sid}{suffix}",
    )
