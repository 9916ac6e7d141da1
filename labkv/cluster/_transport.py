"""The one seam between a rank and its servers (and between servers).

A rank reaches server ``s`` through a :class:`ServerLink`: ``link.call(method,
*args)`` returns a waitable (``result(timeout)``, ``done()``,
``add_done_callback``), and :func:`wait_all` waits for several calls under one
deadline, turning a server known to be lost into an error that names it.
A server reaches its peers (votes on sliced keys) through a :class:`Host`.

Implementations:

- :class:`ActorLink`: the notebook's, through Dask ``Actor`` handles.
- :class:`RankLink`: a rank's (a Dask task), a coroutine on its worker's
  event loop sending what ``Actor.<method>`` sends (:func:`execute_on`).
- :class:`SameProcessLink`: a rank calling a server on its own worker
  in-process: no serialisation, no loopback TCP; arguments travel by reference.

The in-process link and host of the tests (no Dask at all) are in :mod:`._inprocess`.

Every use of Dask internals (an actor's future, a worker's actor table, the
``actor_execute`` RPC, a loop's thread id) lives in this module, and in
:mod:`._channel`, the plain socket on which a primary's small log entries
reach a backup (see :meth:`DaskHost.call_peer`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from ._channel import MAX_BLOB_BYTES, Channel, install
from ._connect import raise_if_scheduler_gone
from ._errors import TIMEOUTS, ClusterError
from ._wire import Peer, encode

# Client-side waits get this much longer than the servers' own, so that the
# server's error (which names the missing ranks) arrives before ours.
GRACE_S = 5.0
# How often a wait for a server looks whether the scheduler reported it lost.
POLL_S = 0.5
# Server methods a rank calls in-process when the server lives on its own Dask
# worker: those whose arguments the server copies or only reads, and whose
# results are fresh objects or values the rank may read.
_LOCAL_METHODS = frozenset({"push", "pull", "keys", "wait_keys", "init"})
# Methods whose one argument is a message (see _wire) that may travel as one frame.
_MESSAGES = frozenset({"push", "pull"})


def _encoded(method: str, args: tuple) -> list:
    return [encode(a) if method in _MESSAGES and isinstance(a, tuple) else a for a in args]


class ServerLink:
    """How a rank reaches server ``sid`` on the Dask worker at ``address``."""

    #: whether arguments reach the server by reference (it copies what it keeps)
    same_process = False
    #: the event loop the link's calls run on, for timers (None: no loop of ours)
    loop: asyncio.AbstractEventLoop | None = None

    def __init__(self, sid: int, address: str):
        self.sid, self.address = sid, address

    def call(self, method: str, *args: Any) -> Any:
        """Call ``method(*args)`` on the server: a future with ``result(timeout)``,
        ``done()`` and ``add_done_callback``; raises at once when the server is
        known to be lost."""
        raise NotImplementedError

    def lost(self) -> str | None:
        """Why the server is known to be lost (its worker gone), or None."""
        return None

    def lost_error(self, exc: BaseException) -> ClusterError:
        """The error a call to a lost server raises."""
        error = ClusterError(
            f"server {self.sid} on Dask worker {self.address} is lost "
            f"(its keys' values and optimizer states are gone): {exc}"
        )
        error._labkv_lost = True  # not an answer: a replicated link fails over
        return error

    def raise_if_lost(self) -> None:
        why = self.lost()
        if why is not None:
            raise self.lost_error(RuntimeError(why))


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


# -- waiting -----------------------------------------------------------------------------
def wait_all(
    calls: list[tuple[ServerLink, Any]],
    what: str,
    timeout: float,
    on_server_error: Callable[[BaseException], None] | None = None,
    on_tick: Callable[[], None] | None = None,
) -> list[Any]:
    """Results of in-flight calls ``(link, future)``, in order; every wait is
    bounded by ``timeout + GRACE_S`` in all. An error a server raised (its
    answer, see ``_server.answered``) goes to ``on_server_error`` first;
    ``on_tick()`` runs every ``POLL_S`` that a call is waited for.

    After a failed call the others are still waited for: a server must have
    answered this call before the next one asks it again (a failed update is
    reported once, to whichever call of the rank comes first)."""
    deadline = time.monotonic() + timeout + GRACE_S
    results, first_error = [], None
    for link, future in calls:
        try:
            results.append(
                _wait_one(link, future, deadline, what, timeout, on_server_error, on_tick)
            )
        except Exception as exc:
            first_error = first_error or exc
    if first_error is not None:
        raise first_error
    return results


def _wait_one(
    link: ServerLink,
    future: Any,
    deadline: float,
    what: str,
    timeout: float,
    on_server_error: Callable[[BaseException], None] | None,
    on_tick: Callable[[], None] | None = None,
) -> Any:
    """A call to a server whose worker died can sit in Dask's connect retries
    for up to its connect timeout, so the wait looks every ``POLL_S`` whether
    the scheduler has reported the server lost."""
    while True:
        try:
            return future.result(timeout=min(POLL_S, max(0.0, deadline - time.monotonic())))
        except ClusterError:
            raise
        except TIMEOUTS as exc:
            if hasattr(exc, "_labkv_server"):  # a server's own answer: raise it as it is
                raise
            link.raise_if_lost()
            if on_tick is not None:
                on_tick()
            if time.monotonic() >= deadline:
                error = ClusterError(
                    f"server {link.sid} on {link.address} did not answer {what} within "
                    f"{timeout + GRACE_S:g} s. The call was sent and may still take effect when "
                    "the server answers (a frozen or overloaded worker): this store waits for "
                    "that answer before its next call leaves, and takes the same push made "
                    "again at once as its retry (see docs/cluster.md, What a timeout means)"
                )
                error._labkv_timeout = True
                raise error from exc
        except Exception as exc:
            if hasattr(exc, "_labkv_server"):  # raised by the server: an updater's error
                if on_server_error is not None:
                    on_server_error(exc)
                raise
            if isinstance(exc, OSError) or "Actor was lost" in str(exc):
                link.raise_if_lost()  # a lost scheduler is named as the cause
                raise link.lost_error(exc) from exc
            raise


# -- what a server needs from its process ------------------------------------------------
class Host:
    """What a :class:`~._server.Server` needs from the process it runs in: its
    address, a way to publish event batches, and calls to its peers."""

    address = "in-process"

    def log_event(self, topic: str, batch: Any) -> None:
        """Publish a batch of events on ``topic``."""

    async def alive(self, address: str) -> bool:
        """Whether the scheduler still has the worker at ``address``."""
        return True

    def call_peer(self, peer: Peer, method: str, args: list) -> Any:
        """An awaitable of ``method(*args)`` on the server ``peer`` (its
        ``(address, actor_key)``), called from the server's loop. A
        ``replicate`` call's entry always reaches the peer as its own copy
        (a backup keeps the arrays it applies)."""
        raise NotImplementedError


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
        the :class:`~._channel.Channel` to its worker; an actor call otherwise,
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
