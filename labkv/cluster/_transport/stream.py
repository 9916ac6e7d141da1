"""Calls to servers on one persistent Dask comm per (calling process, worker).

Every call between processes (a rank's or the notebook's to a server, a
server's to its peers, a primary's log entries to its backups) travels on a
:class:`Stream`: a comm opened once with ``distributed.comm.connect`` to the
worker's *own* listener, with the caller's ``connection_args``, and kept. The
worker end is the handler :data:`HANDLER`, which every worker holding a server
answers (:func:`install`), the way Dask's P2P shuffle adds its handlers. So a
stream inherits whatever the cluster's comm is (``tcp://``, ``tls://`` with
mutual certificate authentication, ``ucxx://``) and opens no port of its own.

Why not an actor call: a Dask actor call is an RPC through the worker's
connection pool to its ``actor_execute`` handler, which looks up the actor and
wraps the answer (about 1 ms between two workers here); from the notebook it
is also proxied through the scheduler unless the client talks to workers
directly. On a stream a call is one message each way: a request
``{"i": seq, "k": actor key, "m": method, "a": args}`` and a reply
``{"i": seq, "r": result}`` (``"x"``: the server's error; ``"gone"``: no such
server on the worker), matched by ``seq``, so any number of calls may be in
flight at once. Arguments and results that are ``bytes`` (the sealed small
messages, see :mod:`labkv.cluster._protocol.packing`) or plain numbers travel
in the message itself; anything else as Dask serialises it, numpy arrays as
their own frames without a copy.

The worker end runs each request as its own task (a pull may wait for other
ranks' pushes while later calls are answered), and only names of the server's
remote methods (:data:`~labkv.cluster._protocol.methods.METHODS`) are called.
A stream that breaks fails its calls in flight with ``OSError`` (the caller
then asks whether the server is lost); the next call opens a new comm.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from .._errors import portable
from .._protocol.methods import method as _method
from .._tasks import TaskGroup

#: The worker handler at the far end of every stream.
HANDLER = "labkv_stream"
#: What Dask may serialise a call's arguments and results with.
SERIALIZERS = ("dask", "pickle")


class ServerGone(OSError):
    """The worker has no server of that actor key (released, or never there)."""


# -- the worker's end --------------------------------------------------------------------
def install(worker: Any) -> None:
    """Make ``worker`` answer :data:`HANDLER` (once per worker process)."""
    if HANDLER not in worker.handlers:
        worker.handlers[HANDLER] = _Service(worker).serve


def calls_served(dask_worker: Any) -> int:
    """How many calls the streams into ``dask_worker`` have answered (for tests
    and benchmarks: ``client.run(calls_served)``)."""
    handler = dask_worker.handlers.get(HANDLER)
    service = getattr(handler, "__self__", None)
    return service.served if isinstance(service, _Service) else 0


def dispatch(obj: Any, method: str, args: Any) -> Any:
    """``obj.<method>(*args)``, the method named by a string: an ``Actor``
    handle's remote methods are its attributes (Dask's API), and a server
    object's are its own."""
    return getattr(obj, method)(*args)


def _wrapped(value: Any) -> Any:
    """``value`` as it goes into a message: in it when msgpack carries it as it
    is, else for Dask to serialise."""
    if value is None or type(value) in (bytes, int, float, bool, str):
        return value
    from distributed.protocol import to_serialize

    return to_serialize(value)


class _Service:
    """The worker's end of every stream into it."""

    def __init__(self, worker: Any):
        self.worker = worker
        self.served = 0  # calls answered, for tests and benchmarks
        self.comms: set = set()  # the streams open into this worker
        self.tasks = TaskGroup()

    async def serve(self, comm: Any, **hello: Any) -> None:
        """Answer every request on ``comm`` until it closes (Dask passes the
        comm to a handler whose first parameter is named ``comm``)."""
        self.comms.add(comm)
        try:
            while True:
                request = await comm.read()
                self.tasks.spawn(self._answer(comm, request))
        except (OSError, asyncio.CancelledError):
            pass  # the caller closed its end, or this worker closes
        finally:
            self.comms.discard(comm)

    async def _answer(self, comm: Any, request: dict) -> None:
        seq = request["i"]
        try:
            name = _method(request["m"]).name  # only a server's remote methods
            server = self.worker.state.actors.get(request["k"])
            if server is None:
                reply = {"i": seq, "gone": f"no server {request['k']} on {self.worker.address}"}
            else:
                reply = {"i": seq, "r": _wrapped(await dispatch(server, name, request["a"]))}
        except Exception as exc:
            reply = {"i": seq, "x": _wrapped(portable(exc))}
        self.served += 1
        await _reply(comm, reply)


async def _reply(comm: Any, reply: dict) -> None:
    """Write ``reply``; a result that cannot be serialised is answered as that
    error; a closed comm has nobody left to tell."""
    if comm.closed():
        return
    try:
        await comm.write(reply, serializers=SERIALIZERS, on_error="raise")
    except OSError:
        pass
    except Exception as exc:
        error = RuntimeError(f"the server's answer could not be serialised: {exc!r}")
        await _reply(comm, {"i": reply["i"], "x": _wrapped(error)})


# -- the caller's end --------------------------------------------------------------------
class Stream:
    """The open comm of this process (one event loop) to the worker at
    ``address``; every call of the loop to a server there goes through it."""

    def __init__(self, address: str, connection_args: dict):
        self.address, self.connection_args = address, connection_args
        self.comm: Any = None
        self.opening: asyncio.Lock | None = None
        self.pending: dict[int, asyncio.Future] = {}
        self.next_seq = 0
        self.readers = TaskGroup()
        self.reachable: bool | None = None  # whether the notebook could open it (see dask.reaches)

    async def call(self, actor_key: str, method: str, args: list) -> Any:
        """``method(*args)`` on the server ``actor_key`` at the far end: its
        result, or the error it raised; ``OSError`` when the stream broke."""
        comm = await self.open()
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        reply = self.pending[seq] = asyncio.get_running_loop().create_future()
        request = {"i": seq, "k": actor_key, "m": method, "a": [_wrapped(a) for a in args]}
        try:
            await comm.write(request, serializers=SERIALIZERS, on_error="raise")
            return await reply
        finally:
            self.pending.pop(seq, None)

    async def open(self, timeout: float | None = None) -> Any:
        """The open comm, connected first when there is none (or it broke)."""
        if self.opening is None:
            self.opening = asyncio.Lock()
        async with self.opening:
            if self.comm is None or self.comm.closed():
                from distributed.comm import connect

                comm = await connect(
                    self.address, timeout=timeout, name="labkv stream", **self.connection_args
                )
                await comm.write({"op": HANDLER, "reply": False})
                self.comm = comm
                self.readers.spawn(_read_replies(comm, self.pending, self.address))
        return self.comm

    def close(self) -> None:
        """Close the comm (calls in flight fail with ``OSError``)."""
        if self.comm is not None:
            self.comm.abort()


async def _read_replies(comm: Any, pending: dict[int, asyncio.Future], address: str) -> None:
    """Hand each reply to its call; when the comm closes, fail the calls still
    waiting (a function, not a method: this task must not keep its
    :class:`Stream` alive)."""
    try:
        while True:
            reply = await comm.read()
            future = pending.get(reply["i"])
            if future is None or future.done():
                continue
            if "x" in reply:
                future.set_exception(reply["x"])
            elif "gone" in reply:
                future.set_exception(ServerGone(reply["gone"]))
            else:
                future.set_result(reply.get("r"))
    except (OSError, asyncio.CancelledError) as exc:
        comm.abort()
        for future in list(pending.values()):
            if not future.done():
                future.set_exception(OSError(f"the stream to {address} closed: {exc!r}"))


_STREAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loop -> {address: Stream}


def stream_to(address: str, connection_args: dict) -> Stream:
    """This loop's stream to the worker at ``address`` (called on the loop)."""
    streams = _STREAMS.setdefault(asyncio.get_running_loop(), {})
    stream = streams.get(address)
    if stream is None:
        stream = streams[address] = Stream(address, connection_args)
    return stream


async def call(connection_args: dict, address: str, actor_key: str, method: str, args: list) -> Any:
    """``method(*args)`` on the server ``actor_key`` at ``address``, through
    this loop's stream there."""
    return await stream_to(address, connection_args).call(actor_key, method, args)
