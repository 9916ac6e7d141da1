"""Re-seeding a replicated server after a failover: a new replica on a live
worker that holds none of that server, seeded from the new primary, so that a
later loss is survived too.

The process that owns the cluster handle does it (the notebook's store, or
:func:`labkv.cluster.run` for its ranks): only a Dask client can start an
actor. The new replica joins the group unseeded (it takes no log entry before
its seed), the primary snapshots its state and forwards every later entry to
it (:meth:`~labkv.cluster._server.actor.Server.add_replica`).
"""

from __future__ import annotations

import contextlib
from typing import Any

from ..._logger import logger
from .._errors import ClusterError
from .._rank.failover import ReplicatedLink
from .._transport.dask import notebook_link
from .connect import ClusterHandle
from .launch import start_server


def free_worker(handle: ClusterHandle, holders: list[str]) -> str | None:
    """A live worker that holds no replica (``holders``), or None."""
    free = [w for w in handle.workers() if w not in holders]
    return free[0] if free else None


def reseed(
    handle: ClusterHandle,
    spec: Any,
    link: ReplicatedLink,
    futures: list,
    busy: tuple[str, ...] = (),
) -> str | None:
    """Start a new replica of ``link``'s server on a free worker and add it to
    the group; its future is appended to ``futures`` (released with the store).
    The new replica's worker, or None when every live worker holds one or is
    ``busy`` (runs a rank: an actor starts as a task, which would wait for the
    rank to end)."""

    members = [(m.address, m.actor_key) for m in link.members]
    # The scheduler may still list a worker this link has found dead: an actor
    # pinned there would only time out.
    dead = [m.address for m in link.gone]
    address = free_worker(handle, [a for a, _ in members] + dead + list(busy))
    if address is None:
        return None
    sid, timeout = link.sid, spec.timeout
    device = "cpu" if spec.server_devices[sid].startswith("cpu") else "auto"
    replica = len(link.links)
    future = start_server(
        handle, spec.store_id, spec.kind, sid, 1, timeout, device, spec.staleness, address, replica
    )
    futures.append(future)
    try:
        with handle.client.as_current():
            actor = future.result(timeout=timeout)
        peer = (address, future.key)
        actor.join_group([*members, peer], len(members), False).result(timeout=timeout)
        link.add(peer, notebook_link(sid, address, actor, handle.client))
        epoch, group = link.primary.call("add_replica", peer).result(timeout)
    except Exception as exc:
        handle.client.cancel([future])
        raise ClusterError(
            f"a new replica of server {sid} on {address} did not start: {exc}"
        ) from exc
    link.adopt(epoch, group)
    return address


def heal(
    handle: ClusterHandle,
    spec: Any,
    links: list[ReplicatedLink],
    futures: list,
    busy: tuple[str, ...] = (),
) -> list[int]:
    """After the cluster's workers changed: promote the next replica of every
    server whose primary is gone (the ranks' links then find it promoted), and
    re-seed every server short of replicas on a worker that is not ``busy``
    (one that joined later is used at a later call). The server ids left with
    no replica at all (their keys are lost)."""
    live, dead = set(handle.workers()), []
    for link in links:
        if link.address not in live:
            try:
                link.fail_over()
            except ClusterError:
                dead.append(link.sid)
                continue
        link.prune(live)
        if len(link.members) < spec.replicas:
            with contextlib.suppress(ClusterError):  # the run goes on with fewer
                reseed(handle, spec, link, futures, busy)
    return dead


def replica_lost(
    events: Any,
    rank: int,
    handle: ClusterHandle | None,
    spec: Any,
    link: ReplicatedLink,
    futures: list,
) -> None:
    """A store's link lost a replica of its server (the store reported the
    failover): the notebook's store (``handle``) starts a new replica in place
    of the lost one (its future appended to ``futures``), reported on ``events``."""
    if handle is not None and len(link.members) < spec.replicas:
        try:
            added = reseed(handle, spec, link, futures)
        except ClusterError as exc:  # the store carries on with the replicas it has
            added, extra = None, {"error": str(exc)}
        else:
            extra = {"added": added}
        if added is not None or "error" in extra:  # None: no free worker, asked again later
            extra["replicas"] = link.failover.replicas()
            if added is not None:
                logger.info(
                    "store %s: server %d re-seeded on %s (replicas %s)",
                    spec.store_id,
                    link.sid,
                    added,
                    ", ".join(extra["replicas"]),
                )
            else:
                logger.warning(
                    "store %s: server %d not re-seeded: %s", spec.store_id, link.sid, extra["error"]
                )
            events.emit("reseed", None, rank=rank, server=link.sid, extra=extra)
