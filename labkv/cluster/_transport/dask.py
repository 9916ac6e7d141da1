"""The Dask implementations of the seam (:mod:`.base`), and the scheduler's liveness.

- :class:`ActorLink`: the notebook's, through Dask ``Actor`` handles.
- :class:`RankLink`: a rank's (a Dask task), a coroutine on its worker's
  event loop sending what ``Actor.<method>`` sends (:func:`execute_on`).
- :class:`SameProcessLink`: a rank calling a server on its own worker
  in-process: no serialisation, no loopback TCP; arguments travel by reference.
- :class:`DaskHost`: what a server needs from its Dask worker.
- :func:`scheduler_gone`: whether a client's scheduler is gone, and why.

Every use of Dask internals by a link or a host (an actor's future, a worker's
actor table, the ``actor_execute`` RPC, a loop's thread id) lives in this
module, and in :mod:`.channel`, the plain socket on which a primary's small log
entries reach a backup (see :meth:`DaskHost.call_peer`).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from .._errors import ClusterError
from .._protocol.messages import Peer
from .base import Host, ServerLink, _encoded
from .channel import MAX_BLOB_BYTES, Channel, install

# Server methods a rank calls in-process when the server lives on its own Dask
# worker: those whose arguments the server copies or only reads, and whose
# results are fresh objects or values the rank may read.
_LOCAL_METHODS = frozenset({"push", "pull", "keys", "wait_keys", "init"})


def _actor_lost(actor: Any) -> str | None:
    future = getattr(actor, "_future", None)  # Dask internals: the actor's own future
    if future is not None and future.status not in ("finished", "pending"):
        return f"Worker holding Actor was lost ({future.status})"
    return None


class ActorLink(ServerLink):
    """Through a Dask ``Actor`` handle (the notebook's store)."""

    def __init__(self, sid: int, address: str, actor: Any):
        super().__init__(sid, address)
        self.actor = actor

    def call(self, method: str, *args: Any) -> Any:
        self.raise_if_lost()
        try:
            return getattr(self.actor, method)(*_encoded(method, args))
        except (OSError, RuntimeError) as exc:  # "Worker holding Actor was lost"
            raise self.lost_error(exc) from exc

    def lost(self) -> str | None:
        return _actor_lost(self.actor)

    def raise_if_lost(self) -> None:
        # A lost scheduler first: it explains every server lost after it (its
        # workers stop with it), and no replica can take over then.
        client = getattr(self.actor, "_client", None)
        if client is not None:
            raise_if_scheduler_gone(client)
        super().raise_if_lost()


class RankLink(ServerLink):
    """A rank's link: each call is a coroutine put on its worker's event loop
    with ``run_coroutine_threadsafe``: one hand-off to the loop, and a finished
    call's result is read without another (an ``Actor`` future's ``result()``
    always goes through the loop)."""

    def __init__(self, sid: int, address: str, actor: Any, worker: Any, loop: Any):
        super().__init__(sid, address)
        self.actor, self.worker, self.loop = actor, worker, loop

    def call(self, method: str, *args: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(self._coro(method, args), self.loop)

    def _coro(self, method: str, args: tuple) -> Any:
        """The call's coroutine, made in the caller's thread: a server known to
        be lost raises there, at once."""
        self.raise_if_lost()
        return self._remote(method, args)

    async def _remote(self, method: str, args: tuple) -> Any:
        """What ``Actor.<method>(*args)`` sends, awaited on the worker's loop."""
        return await execute_on(
            self.worker, self.address, self.actor.key, method, _encoded(method, args)
        )

    def lost(self) -> str | None:
        return _actor_lost(self.actor)


class SameProcessLink(RankLink):
    """A rank's link to a server on its own worker: the server's methods that
    copy what they keep are called in-process (see ``_LOCAL_METHODS``); Dask's
    actor calls would take a socket to the worker's own address."""

    same_process = True

    def __init__(self, sid: int, address: str, actor: Any, worker: Any, loop: Any, server: Any):
        super().__init__(sid, address, actor, worker, loop)
        self.server = server

    def _coro(self, method: str, args: tuple) -> Any:
        if method not in _LOCAL_METHODS:
            return super()._coro(method, args)
        self.raise_if_lost()
        if self.worker.state.actors.get(self.actor.key) is not self.server:
            raise self.lost_error(RuntimeError("the server actor is gone from its worker"))
        return getattr(self.server, method)(*args)


def rank_links(addresses: list[str], actors: list[Any], server_type: type) -> list[ServerLink]:
    """The links of a rank (a Dask task) to the servers ``actors`` at
    ``addresses``: in-process to those on its own worker. Outside a Dask task,
    or on the worker's loop thread itself (where a blocking wait would
    deadlock), the actors' own links."""
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):  # not in a Dask task
        worker = None
    loop = None if worker is None else getattr(worker.loop, "asyncio_loop", None)
    if loop is None or threading.get_ident() == getattr(worker, "thread_id", None):
        return [ActorLink(s, a, actor) for s, (a, actor) in enumerate(zip(addresses, actors))]
    links: list[ServerLink] = []
    for s, (address, actor) in enumerate(zip(addresses, actors, strict=True)):
        local = None
        if address == worker.address:
            local = worker.state.actors.get(getattr(actor, "key", None))
        if isinstance(local, server_type):
            links.append(SameProcessLink(s, address, actor, worker, loop, local))
        else:
            links.append(RankLink(s, address, actor, worker, loop))
    return links


def on_client_loop(client: Any) -> bool:
    """Whether this thread is the Dask client's own event loop thread (where
    waiting for a call would deadlock)."""
    return getattr(client.loop.asyncio_loop, "_thread_id", None) == threading.get_ident()


async def execute_on(worker: Any, address: str, actor_key: str, method: str, args: list) -> Any:
    """What ``Actor.<method>(*args)`` sends, from ``worker``'s event loop to the
    actor ``actor_key`` on the worker at ``address``: its result, or its error."""
    from distributed.protocol import to_serialize

    try:
        reply = await worker.rpc(address).actor_execute(
            function=method, actor=actor_key, args=[to_serialize(a) for a in args], kwargs={}
        )
    except OSError as exc:
        raise OSError(f"Unable to contact Actor's worker: {exc}") from exc
    if reply["status"] == "OK":
        return reply["result"]
    raise reply["exception"]


async def workers_of(worker: Any) -> set[str]:
    """The addresses of the workers the scheduler has now, asked from ``worker``."""
    info = await worker.scheduler.identity()
    return set(info.get("workers", {}))


class DaskHost(Host):
    """The Dask worker a server actor lives on."""

    def __init__(self, worker: Any = None):
        if worker is None:
            from distributed import get_worker

            worker = get_worker()
        self.worker, self.address = worker, worker.address
        self.channels: dict[str, Channel] = {}
        install(worker)

    def log_event(self, topic: str, batch: Any) -> None:
        self.worker.log_event(topic, batch)

    async def alive(self, address: str) -> bool:
        return address in await workers_of(self.worker)

    def call_peer(self, peer: Peer, method: str, args: list) -> Any:
        if method == "replicate":  # never in-process: a backup keeps what it applies
            return self._replicate(peer, args[0])
        address, actor_key = peer.address, peer.actor_key
        local = self.worker.state.actors.get(actor_key) if address == self.address else None
        if local is not None and hasattr(local, method):
            return getattr(local, method)(*args)
        return execute_on(self.worker, address, actor_key, method, args)

    async def _replicate(self, peer: Peer, entry: tuple) -> None:
        """``replicate(entry)`` on ``peer``: an entry without big values through
        the :class:`~labkv.cluster._transport.channel.Channel` to its worker; an actor call otherwise,
        when there is no channel, or when it broke (the actor call then finds
        out whether the peer is alive)."""
        _, blob, bigs = entry
        fits = not bigs and len(blob) <= MAX_BLOB_BYTES
        channel = self._channel_to(peer.address) if fits else None
        if channel is not None and not channel.unavailable:
            try:
                return await channel.replicate(peer.actor_key, entry)
            except OSError:
                pass
        return await execute_on(self.worker, peer.address, peer.actor_key, "replicate", [entry])

    def _channel_to(self, address: str) -> Channel:
        channel = self.channels.get(address)
        if channel is None:
            channel = self.channels[address] = Channel(self.worker, address)
        return channel


def scheduler_gone(client: Any) -> str | None:
    """Why ``client`` has no scheduler any more (its connection broke and it is
    reconnecting, or it closed), or None."""
    status = getattr(client, "status", "running")
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
