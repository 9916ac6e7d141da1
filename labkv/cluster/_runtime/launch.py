"""Starting a store's servers on Dask workers.

- :class:`DaskServer`: a server actor whose host is its worker.
- :func:`start_servers`: the server actors of a new store, pinned to workers.
- :func:`start_server`: one of them (or a new replica, see ``reseed``).
- :func:`check_cluster_args`: the checks made before anything starts.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import distributed

from ..._log import logger
from ..._types import SYNC_KINDS
from .._errors import TIMEOUTS, ClusterError
from .._events import topic_of
from .._options import (
    StoreSpec,
)
from .._placement import DEFAULT_BIGARRAY_BOUND
from .._server.actor import Server
from .._transport.dask import DaskHost
from .connect import ClusterHandle


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
    within ``timeout`` (its worker gone), fails the call, and the servers
    already started are released.
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
    with client.as_current():
        try:
            distributed.wait(futures, timeout=timeout)
        except TIMEOUTS:
            late = [s for s, f in enumerate(futures) if f.status == "pending"]
            client.cancel(futures)
            raise ClusterError(
                f"servers {late} of {store_id} did not start within {timeout:g} s on Dask "
                f"worker(s) {sorted({addresses[s] for s in late})} (gone, or too busy?)"
            ) from None
        try:
            actors = client.gather(futures)
            devices = [actor.device_name for actor in actors[:num_servers]]
            peers = [(addresses[s], futures[s].key) for s in range(num_servers)]
            for call in [actor.link(peers) for actor in actors]:
                call.result(timeout=timeout)
            members = [
                [(a, futures[i].key) for i, (t, _, a) in enumerate(where) if t == s]
                for s in range(num_servers)
            ]
            if replicas > 1:
                calls = [actor.join_group(members[s], r) for actor, (s, r, _) in zip(actors, where)]
                for call in calls:
                    call.result(timeout=timeout)
        except Exception as exc:
            client.cancel(futures)
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
