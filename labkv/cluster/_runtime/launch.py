"""Starting a store's servers, and the store a notebook makes.

- :class:`StoreSpec`: what a rank needs to reach a store's servers.
- :func:`start_servers`: the server actors of a new store, pinned to workers.
- :func:`create_store`: ``labkv.create('dist_sync', cluster=handle)``.
- :func:`check_cluster_args`: the checks made before anything starts.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import distributed

from ..._types import SYNC_KINDS, dist_kind
from .._device import parse_server_device
from .._errors import TIMEOUTS, ClusterError
from .._events import topic_of
from .._options import (
    DEFAULT_TIMEOUT_S,
    StoreSpec,
    check_replicas,
    check_staleness,
)
from .._placement import DEFAULT_BIGARRAY_BOUND
from .._rank.store import DistStore
from .._server.actor import Server
from .._transport.dask import DaskHost
from .compat import check_cluster
from .connect import ClusterHandle, default_handle
from .links import new_store


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


def create_store(
    kind: str,
    cluster: ClusterHandle | None = None,
    num_servers: int | None = None,
    bigarray_bound: int = DEFAULT_BIGARRAY_BOUND,
    timeout: float = DEFAULT_TIMEOUT_S,
    server_workers: list[str] | None = None,
    server_device: str = "auto",
    staleness: int | None = None,
    replicas: int = 1,
) -> DistStore:
    """A ``dist_*`` store for this process (rank 0 of 1): what
    ``labkv.create('dist_sync', cluster=handle, num_servers=S)`` calls.
    ``kind`` is any distributed type name ``labkv.create`` takes (MXNet's
    ``'dist'`` and ``'dist_sync_device'`` too).

    ``cluster``: a handle from :func:`labkv.cluster.connect` (default: the
    cluster this process attached to, see :func:`labkv.cluster.default_handle`;
    an embedded one is started only when there is none). The scheduler and the
    workers are checked first (labkv's version and wire protocol, numpy's major
    version): a mismatch fails within seconds, naming each node. ``num_servers`` defaults to the
    number of Dask workers; ``server_workers`` pins servers to given workers
    (round-robin). ``timeout`` bounds every cross-process wait.
    ``server_device``: where servers keep their values: ``'auto'`` (the
    worker's GPU when it has one, else the host), ``'cpu'``, ``'gpu'`` or
    ``'gpu(i)'`` (see ``kv.placement()``). ``staleness`` (``'dist_ssp'``
    only, required there): a pull by a rank that has pushed a key ``c`` times
    waits until every rank has pushed it ``c - staleness`` times (0: as
    dist_sync; large: as dist_async); a push of a list of keys is one push of
    each; see ``docs/cluster.md``. ``replicas``:
    how many copies of each server live on different workers (default 1);
    with 2 or more, losing a server's worker loses nothing acknowledged: its
    backup takes over, and ``kv.placement()`` names every piece's replicas.

    >>> import labkv
    >>> kv = labkv.create("dist_sync", cluster=handle, num_servers=2)  # doctest: +SKIP
    >>> kv.rank, kv.num_workers  # doctest: +SKIP
    (0, 1)
    >>> kv = labkv.create("dist_sync", cluster=handle, num_servers=1, replicas=2)  # doctest: +SKIP
    >>> kv.init(0, np.zeros(2)); kv.placement()[0][0]["replicas"]  # doctest: +SKIP
    ['tcp://127.0.0.1:40001', 'tcp://127.0.0.1:40002']
    """
    kind, name = dist_kind(kind), kind.lower()
    check_cluster_args(cluster, timeout)
    staleness = check_staleness(kind, staleness)
    replicas = check_replicas(replicas)
    if num_servers is not None and (not isinstance(num_servers, int) or num_servers < 1):
        raise ValueError(f"num_servers must be a positive int, got {num_servers!r}")
    if int(bigarray_bound) < 1:
        raise ValueError(f"bigarray_bound must be positive, got {bigarray_bound!r}")
    parse_server_device(server_device)
    handle = cluster if cluster is not None else default_handle()
    workers = server_workers or handle.workers()
    num_servers = num_servers or len(workers)
    check_cluster(handle, workers)
    futures, actors, spec = start_servers(
        handle,
        kind,
        num_servers,
        1,
        timeout,
        workers,
        server_device,
        bigarray_bound,
        name=name,
        staleness=staleness,
        replicas=replicas,
    )
    return new_store(
        spec,
        actors[:num_servers],
        0,
        1,
        owner=True,
        handle=handle,
        release=lambda: handle.client.cancel(futures),
        replica_actors=actors,
    )
