"""The Dask implementations of the seam (:mod:`.base`), and the scheduler's liveness.

- :class:`StreamLink`: a rank's (a Dask task's) or the notebook's, each call
  a coroutine on the worker's (or the client's) event loop, sent on that
  loop's :class:`~.stream.Stream` to the server's worker.
- :class:`SameProcessLink`: a rank calling a server on its own worker
  in-process: no serialisation, no loopback TCP; arguments travel by reference.
- :class:`ActorLink`: through Dask ``Actor`` handles, the fallback of a
  notebook that cannot reach the workers itself (behind a gateway), chosen in
  one place: :func:`notebook_link`.
- :class:`DaskHost`: what a server needs from its Dask worker; its calls to
  its peers go on streams too.
- the scheduler's liveness and event topics: :mod:`.scheduler`.

Every use of Dask internals by a link or a host (an actor handle's task,
client and address, a worker's actor table and loop, the text of Dask's
"actor was lost" error) lives in this module, one helper each, and in
:mod:`.stream`, the comm handler and its callers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import weakref
from typing import Any

from .._errors import answered_by
from .._protocol.messages import Peer
from .._protocol.methods import method as _method
from . import stream as _stream
from .base import Host, ServerLink, _encoded
from .scheduler import raise_if_scheduler_gone
from .stream import dispatch as _dispatch
from .stream import on_loop


# -- Dask's internals, one helper each -----------------------------------------------------
def _actor_task(actor: Any) -> Any:
    """An ``Actor`` handle's future of its own task (None in a handle without a
    client, e.g. one unpickled in a task)."""
    return actor._future


def _actor_client(actor: Any) -> Any:
    """The client an ``Actor`` handle calls through (None on a worker)."""
    return actor._client


def actor_address(actor: Any) -> str | None:
    """The worker an ``Actor`` handle points to."""
    return actor._address


def _asyncio_loop(io_loop: Any) -> asyncio.AbstractEventLoop:
    """The asyncio loop under a worker's or a client's tornado loop."""
    return io_loop.asyncio_loop


def worker_loop(worker: Any) -> asyncio.AbstractEventLoop:
    """The asyncio loop of a Dask worker (where its RPCs run)."""
    return _asyncio_loop(worker.loop)


def task_worker() -> Any | None:
    """The Dask worker running this task, or None outside a task."""
    try:
        from distributed import get_worker

        return get_worker()
    except (ImportError, ValueError):
        return None


def actor_on(worker: Any, address: str, actor_key: str) -> Any | None:
    """The actor object ``actor_key`` itself when it lives on ``worker`` (at
    ``address``), else None: the same-worker lookup, through the worker's actor
    table (as distributed's own "actor calls actor on same worker")."""
    if address != worker.address:
        return None
    return worker.state.actors.get(actor_key)


def _actor_was_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is Dask's error for an actor whose worker is gone: a plain
    ``RuntimeError`` whose text is all that tells it from any other."""
    return isinstance(exc, RuntimeError) and "Actor was lost" in str(exc)


def _task_lost(actor: Any) -> str | None:
    future = _actor_task(actor)
    if future is not None and future.status not in ("finished", "pending"):
        return f"Worker holding Actor was lost ({future.status})"
    return None


def on_client_loop(client: Any) -> bool:
    """Whether this thread is the Dask client's own event loop thread (where
    waiting for a call would deadlock)."""
    return on_loop(_asyncio_loop(client.loop))


# -- links -----------------------------------------------------------------------------------
class _ActorCall:
    """An ``Actor`` call's future, whose Dask "actor was lost" error is a
    :class:`~labkv.cluster._errors.ServerLost` of its link."""

    __slots__ = ("future", "link")

    def __init__(self, link: ServerLink, future: Any):
        self.link, self.future = link, future

    def result(self, timeout: float | None = None) -> Any:
        """The actor call's result (see :class:`~.base.Waitable`)."""
        try:
            return self.future.result(timeout)
        except RuntimeError as exc:
            if answered_by(exc) is None and _actor_was_lost(exc):
                raise self.link._lost_error(exc) from exc
            raise

    def done(self) -> bool:
        """Whether the actor call has answered."""
        return self.future.done()


class ActorLink(ServerLink):
    """Through a Dask ``Actor`` handle (the notebook's store)."""

    def __init__(self, sid: int, address: str, actor: Any):
        super().__init__(sid, address)
        self.actor = actor

    def call(self, method: str, *args: Any) -> Any:
        self._raise_if_lost()
        try:
            future = _dispatch(self.actor, method, _encoded(method, args))
        except (OSError, RuntimeError) as exc:  # "Worker holding Actor was lost"
            raise self._lost_error(exc) from exc
        return _ActorCall(self, future)

    def lost(self) -> str | None:
        return _task_lost(self.actor)

    def _raise_if_lost(self) -> None:
        # A lost scheduler first: it explains every server lost after it (its
        # workers stop with it), and no replica can take over then.
        client = _actor_client(self.actor)
        if client is not None:
            raise_if_scheduler_gone(client)
        super()._raise_if_lost()


class StreamLink(ServerLink):
    """Calls on a stream (:mod:`.stream`) of ``loop`` (a rank's worker's, or
    the notebook client's): each call is written from the caller's thread when
    the stream is open on a socket any thread may write (``tcp://``, ``tls://``), else handed
    to the loop with ``call_soon_threadsafe`` and written there without a task;
    its reply settles the call's ``concurrent.futures.Future``, whose result is
    read without another hand-off (on a stream of the link's own, see
    :meth:`own_stream`, the waiting thread reads the reply itself). ``actor``: the server's ``Actor``
    handle, when the caller has one (its task's status tells a loss early);
    ``client``: the notebook's Dask client (a lost scheduler is named first)."""

    def __init__(
        self,
        sid: int,
        address: str,
        actor_key: str,
        loop: asyncio.AbstractEventLoop,
        connection_args: dict,
        actor: Any = None,
        client: Any = None,
    ):
        super().__init__(sid, address)
        self.actor_key, self.loop, self.connection_args = actor_key, loop, connection_args
        self.actor, self.client = actor, client
        self.own: _stream.Stream | None = None

    def own_stream(self) -> None:
        """Calls go on a stream of this link's own from now on, which the loop
        does not watch: the thread that waits for a reply reads it
        (:class:`~.stream.Pumped`), so a reply costs no wake-up of the loop and
        no hand-off to the waiting thread. A rank's plain links take one; a
        replicated link's members do not: while a near read waits for its
        backup, the primary's answer to the pushes it carried must be seen at
        once (a refusal is raised at once), and nobody would read the
        primary's stream meanwhile.
        The stream closes with the link."""
        self.own = _stream.Stream(self.address, self.connection_args, watched=False)
        weakref.finalize(self, self.own.close)

    def call(self, method: str, *args: Any) -> Any:
        # A server known to be lost raises here, at once; the message is encoded
        # in the caller's thread, and sent from it too once the stream is open.
        self._raise_if_lost()
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._send(method, args, future)
        return future if self.own is None else _stream.Pumped(future, self.own)

    def read_replies(self, call: Any, timeout: float | None) -> None:
        if self.own is not None:
            call.read_until_answered(timeout)

    def notify(self, method: str, *args: Any) -> None:
        self._raise_if_lost()
        self._send(method, args, None)

    def _send(self, method: str, args: tuple, future: concurrent.futures.Future | None) -> None:
        """The request on the link's own stream, or on the loop's shared one."""
        encoded = _encoded(method, args)
        if self.own is not None:
            _stream.send_own(self.own, self.loop, self.actor_key, method, encoded, future)
        else:
            where = (self.loop, self.connection_args, self.address, self.actor_key)
            _stream.send(*where, method, encoded, future)

    def lost(self) -> str | None:
        return None if self.actor is None else _task_lost(self.actor)

    def _raise_if_lost(self) -> None:
        if self.client is not None:  # a lost scheduler explains every lost server
            raise_if_scheduler_gone(self.client)
        super()._raise_if_lost()


class SameProcessLink(StreamLink):
    """A rank's link to a server on its own worker: the server's methods that
    copy what they keep are called in-process (``Method.local`` in
    :mod:`labkv.cluster._protocol.methods`); the others go on a stream to the
    worker's own address."""

    def __init__(
        self,
        sid: int,
        address: str,
        actor_key: str,
        worker: Any,
        server: Any,
        actor: Any = None,
    ):
        super().__init__(
            sid, address, actor_key, worker_loop(worker), worker.connection_args, actor
        )
        self.worker, self.local = worker, server

    def notify(self, method: str, *args: Any) -> None:
        if not _method(method).local:
            super().notify(method, *args)
        else:
            self.call(method, *args)

    def call(self, method: str, *args: Any) -> Any:
        if not _method(method).local:
            return super().call(method, *args)
        self._raise_if_lost()
        if actor_on(self.worker, self.address, self.actor_key) is not self.local:
            raise self._lost_error(RuntimeError("the server actor is gone from its worker"))
        return asyncio.run_coroutine_threadsafe(_dispatch(self.local, method, args), self.loop)


def rank_link(
    sid: int,
    address: str,
    actor_key: str,
    server_type: type,
    actor: Any = None,
    own_stream: bool = False,
) -> ServerLink:
    """A rank's (a Dask task's) link to server ``sid``, the actor ``actor_key``
    at ``address`` (``actor``: its handle, if the rank has one): in-process to
    a server on the rank's own worker; to another worker on a stream of the
    link's own with ``own_stream`` (:meth:`StreamLink.own_stream`), else on the
    worker loop's shared one. Outside a Dask task, or on the worker's
    loop thread itself (where a blocking wait would deadlock), an actor's own link."""
    worker = task_worker()
    loop = None if worker is None else worker_loop(worker)
    if loop is None or on_loop(loop):
        if actor is None:
            from distributed import Actor

            actor = Actor(server_type, address, actor_key)
        return ActorLink(sid, address, actor)
    local = actor_on(worker, address, actor_key)
    if isinstance(local, server_type):
        return SameProcessLink(sid, address, actor_key, worker, local, actor)
    link = StreamLink(sid, address, actor_key, loop, worker.connection_args, actor)
    if own_stream:
        link.own_stream()
    return link


def rank_links(addresses: list[str], actors: list[Any], server_type: type) -> list[ServerLink]:
    """The links of a rank to the servers ``actors`` (``Actor`` handles) at
    ``addresses`` (see :func:`rank_link`)."""
    return [
        rank_link(s, address, actor.key, server_type, actor, own_stream=True)
        for s, (address, actor) in enumerate(zip(addresses, actors, strict=True))
    ]


# -- the notebook's links: a stream when it reaches the worker -------------------------------
#: Seconds the notebook tries to open a stream to a worker before it takes the
#: actor path to it (a worker it cannot reach, behind a gateway).
REACH_TIMEOUT_S = 5.0


def _transport_setting() -> str:
    """``labkv.transport`` in Dask's config: ``'auto'`` (a stream where the
    notebook reaches the worker, else actor calls) or ``'actor'``."""
    import dask

    value = dask.config.get("labkv.transport", "auto")
    if value not in ("auto", "actor"):
        raise ValueError(f"dask config labkv.transport must be 'auto' or 'actor', got {value!r}")
    return value


def notebook_link(sid: int, address: str, actor: Any, client: Any) -> ServerLink:
    """The notebook's link to server ``sid`` (the ``Actor`` handle ``actor``
    at ``address``): on a stream from the client's loop when this process can
    open one to the worker, else through the actor handle (calls the scheduler
    relays). The one place the two are chosen."""
    if _transport_setting() == "actor" or not reaches(client, address, actor.key):
        return ActorLink(sid, address, actor)
    loop = _asyncio_loop(client.loop)
    return StreamLink(sid, address, actor.key, loop, client.connection_args, actor, client)


def reaches(client: Any, address: str, actor_key: str) -> bool:
    """Whether this process can open a stream to the worker at ``address``
    (tried once per client loop and worker, within :data:`REACH_TIMEOUT_S`),
    with a call to the server ``actor_key`` there: a stream that has served
    a call is not closed as a silent one (see :mod:`.stream`)."""

    async def attempt() -> bool:
        stream = _stream.stream_to(address, client.connection_args)
        if stream.reachable is None:
            try:  # the connect, the hello's answer and the call, within the bound
                await asyncio.wait_for(
                    stream.call(actor_key, "keys", [[]]), timeout=REACH_TIMEOUT_S
                )
                stream.reachable = True
            except (OSError, asyncio.TimeoutError):
                stream.reachable = False
        return stream.reachable

    return client.sync(attempt)


async def workers_of(worker: Any) -> set[str]:
    """The addresses of the workers the scheduler has now, asked from ``worker``."""
    info = await worker.scheduler.identity()
    return set(info.get("workers", {}))


class DaskHost(Host):
    """The Dask worker a server actor lives on; it answers streams
    (:func:`~.stream.install`), and its calls to peers go on streams too."""

    def __init__(self, worker: Any = None):
        if worker is None:
            from distributed import get_worker

            worker = get_worker()
        self.worker, self.address = worker, worker.address
        _stream.install(worker)

    def log_event(self, topic: str, batch: Any) -> None:
        self.worker.log_event(topic, batch)

    async def alive(self, address: str) -> bool:
        return address in await workers_of(self.worker)

    def call_peer(self, peer: Peer, method: str, args: list) -> Any:
        # A replicate call never runs in-process: a backup keeps what it applies.
        local = actor_on(self.worker, peer.address, peer.actor_key)
        if local is not None and method != "replicate":
            return _dispatch(local, method, args)
        where = (self.worker.connection_args, peer.address, peer.actor_key)
        return _stream.request(*where, method, args)
