"""Building a store and its links to its servers.

The notebook's store reaches each server on a stream from its client's loop
(through the Dask ``Actor`` handle where it cannot reach the worker, see
:func:`~labkv.cluster._transport.dask.notebook_link`); a rank (a Dask task) on
a stream from its worker's loop, in-process to a server on its own worker. Servers with replicas are wrapped in one
:class:`~labkv.cluster._rank.failover.ReplicatedLink` per server id.
:func:`new_store` builds the links, the store, and the re-seeding of a lost
replica (a driver's job), so that the rank's code never imports the driver;
:func:`create_store` is the store a notebook makes (``labkv.create('dist_sync',
cluster=handle)``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

from ..._types import dist_kind
from .._device import parse_server_device
from .._options import DEFAULT_TIMEOUT_S, check_replicas, check_staleness
from .._placement import DEFAULT_BIGARRAY_BOUND
from .._rank.dist_store import DistStore
from .._rank.failover import ReplicatedLink
from .._transport.base import ServerLink
from .._transport.dask import (
    notebook_link,
    rank_link,
    rank_links,
    task_worker,
    worker_loop,
    workers_of,
)
from .compat import check_cluster
from .connect import ClusterHandle, default_handle
from .launch import check_cluster_args, start_servers
from .reseed import replica_lost
from .waits import announced


# -- building a store's links ----------------------------------------------------------------
def replicated_links(spec: Any, handle: Any, actors: list[Any] | None) -> list[ReplicatedLink]:
    """The links of a store whose servers have replicas (``spec.replica_members``):
    through the ``actors`` handles (all replicas, replica-major, as
    ``start_servers`` returns them) in the notebook (``handle``), else a rank's
    links (in-process to replicas on its own worker)."""
    from distributed import Actor

    from .._server.actor import Server

    if handle is not None:

        def make(sid: int, address: str, key: str) -> ServerLink:
            with handle.client.as_current():
                return notebook_link(sid, address, Actor(Server, address, key), handle.client)

        def alive(address: str) -> bool:
            # An actor pinned to a dead worker may read "pending" again, not lost.
            try:
                return address in handle.workers()
            except Exception:
                return True  # the scheduler did not answer: no news of a loss

        def holding() -> dict[str, Any]:
            return handle.client.has_what()

    else:

        def make(sid: int, address: str, key: str) -> ServerLink:
            return rank_link(sid, address, key, Server)

        alive, holding = _scheduler_alive(), _scheduler_holding()

    def find(sid: int) -> list[tuple[str, str]]:
        """The replicas of server ``sid`` that the scheduler lists now."""
        if holding is None:
            return []
        named = re.compile(rf"labkv-server-{re.escape(spec.store_id)}-{sid}(-r\d+)?$")
        found = holding()
        return [(w, str(k)) for w, keys in found.items() for k in keys if named.match(str(k))]

    links = []
    num_servers = spec.num_servers
    for s, members in enumerate(spec.replica_members):
        given = None
        if handle is not None and actors is not None:
            given = [
                notebook_link(s, a, actors[r * num_servers + s], handle.client)
                for r, (a, _) in enumerate(members)
            ]
        links.append(ReplicatedLink(s, members, make, given, alive=alive, find=find))
    return links


def _scheduler_alive() -> Callable[[str], bool] | None:
    """In a rank (a Dask task): whether the scheduler still has a worker, asked
    through the rank's worker. A rank's call to a dead worker can sit in Dask's
    connect retries for 30 s; its waits ask this every ``POLL_S`` instead."""
    worker = task_worker()
    if worker is None:
        return None
    loop = worker_loop(worker)

    def alive(address: str) -> bool:
        try:
            workers = asyncio.run_coroutine_threadsafe(workers_of(worker), loop).result(5)
        except Exception:
            return True  # the scheduler did not answer: no news of a loss
        return address in workers

    return alive


def _scheduler_holding() -> Callable[[], dict[str, Any]] | None:
    """In a rank: the keys each worker holds, as the scheduler lists them (asked
    through the rank's worker; a replica seeded after the rank's last reply is
    found there)."""
    worker = task_worker()
    if worker is None:
        return None
    loop = worker_loop(worker)

    def holding() -> dict[str, Any]:
        ask = worker.scheduler.has_what()
        return asyncio.run_coroutine_threadsafe(ask, loop).result(5)

    return holding


def store_links(
    spec: Any, servers: list[Any], handle: Any, replica_actors: list[Any] | None = None
) -> list[ServerLink]:
    """How a store reaches its servers: the notebook's (``handle``) through the
    actors' handles, a rank's in-process to the servers on its own worker; one
    :class:`ReplicatedLink` per server id when the servers have replicas."""
    from .._server.actor import Server

    if spec.replicas > 1:
        return replicated_links(spec, handle, replica_actors)
    addresses = spec.server_addresses
    if handle is not None:
        return [
            notebook_link(s, a, x, handle.client)
            for s, (a, x) in enumerate(zip(addresses, servers, strict=True))
        ]
    return rank_links(addresses, servers, Server)


def new_store(
    spec: Any,
    servers: list[Any],
    rank: int = 0,
    num_workers: int = 1,
    *,
    owner: bool = True,
    inits_new_keys: bool = False,
    handle: Any = None,
    release: Callable[[], None] | None = None,
    replica_actors: list[Any] | None = None,
    incarnation: int = 0,
) -> DistStore:
    """A :class:`DistStore` on the servers of ``spec``, with its links; the
    notebook's (``handle``) re-seeds the replicas its links lose, and its
    ``release`` stops those too; ``incarnation``: a rank's replacement's number;
    ``inits_new_keys``: rank 0 of a run on the notebook's store."""
    reseeded: list[Any] = []  # futures of replicas started after a failover

    def lost(store: DistStore, link: ReplicatedLink, old: str | None) -> None:
        replica_lost(store.events, store.rank, handle, spec, link, reseeded)

    def release_all() -> None:
        release()
        handle.client.cancel(reseeded)

    return DistStore(
        spec,
        servers,
        rank,
        num_workers,
        links=store_links(spec, servers, handle, replica_actors),
        owner=owner,
        inits_new_keys=inits_new_keys,
        handle=handle,
        release=None if release is None else release_all,
        on_replica_lost=lost,
        incarnation=incarnation,
        announce=announced if handle is not None else None,
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
