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
``(actor key, method, args)`` and a reply (the result, the server's error, or
"no such server on the worker"), matched by a sequence number, so any number of
calls may be in flight at once.

How a message is framed depends on the comm. On ``tcp://`` and ``tls://`` (Dask's TCP
comms, whose socket is a tornado ``IOStream``, TLS included) both ends write their own
frames on the comm's stream once the hello is through (:class:`_Frames`): a fixed
header (sequence number, kind, body bytes, buffer count), the buffers' sizes, the
body pickled with protocol 5, then each out-of-band buffer (a numpy array's memory,
never copied) as it is. That skips Dask's per-message work (msgpack, the frames
header, serialisation dispatch per argument), which cost about a third of a tiny
call's round trip here. On any other comm (``ucxx://``, ``ws://``, ``inproc://``)
messages go through ``comm.write``/``comm.read`` (:class:`_Messages`), with
arguments serialised as Dask does. Either way the bytes travel on Dask's connection,
under its TLS and authentication.

The worker end runs each request as its own task (a pull may wait for other
ranks' pushes while later calls are answered), and only names of the server's
remote methods (:data:`~labkv.cluster._protocol.methods.METHODS`) are called.
A stream that breaks fails its calls in flight with ``OSError`` (the caller
then asks whether the server is lost); the next call opens a new comm.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import struct
import weakref
from typing import Any

import numpy as np

from .._errors import portable
from .._protocol.methods import method as _method
from .._tasks import TaskGroup

#: The worker handler at the far end of every stream.
HANDLER = "labkv_stream"
#: What Dask may serialise a call's arguments and results with.
SERIALIZERS = ("dask", "pickle")


class ServerGone(OSError):
    """The worker has no server of that actor key (released, or never there)."""


# -- the two ways a message is framed -----------------------------------------------------
REQUEST, RESULT, ERROR, GONE = 0, 1, 2, 3  # what a message is


class _Frames:
    """Messages as raw frames on a Dask TCP comm's own ``IOStream`` (see module doc)."""

    HEAD = struct.Struct("<QBIH")  # sequence number, kind, body bytes, buffer count

    def __init__(self, comm: Any):
        self.comm, self.io = comm, comm.stream

    def send(self, seq: int, kind: int, value: Any) -> None:
        from distributed.protocol import pickle

        buffers: list = []
        body = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
        raws = [b.raw() for b in buffers]
        sizes = struct.pack(f"<{len(raws)}Q", *(r.nbytes for r in raws))
        io = self.io
        io.write(self.HEAD.pack(seq, kind, len(body), len(raws)) + sizes + body)
        for raw in raws:  # the arrays' memory itself, without a copy
            io.write(raw)

    async def receive(self) -> tuple[int, int, Any]:
        from distributed.protocol import pickle

        io = self.io
        seq, kind, nbody, nbuffers = self.HEAD.unpack(await io.read_bytes(self.HEAD.size))
        rest = await io.read_bytes(8 * nbuffers + nbody)
        sizes = struct.unpack_from(f"<{nbuffers}Q", rest)
        buffers = []
        for size in sizes:
            buffer = np.empty(size, np.uint8)
            await io.read_into(memoryview(buffer))
            buffers.append(buffer)
        return seq, kind, pickle.loads(memoryview(rest)[8 * nbuffers :], buffers=buffers)


class _Messages:
    """Messages through ``comm.write``/``comm.read`` (any Dask comm)."""

    def __init__(self, comm: Any):
        self.comm = comm
        self.writing: set = set()

    def send(self, seq: int, kind: int, value: Any) -> None:
        from distributed.protocol import Serialized, serialize

        # serialised now, so that a value that cannot be raises here, not in the write
        header, frames = serialize(value, serializers=SERIALIZERS, on_error="raise")
        message = {"i": seq, "t": kind, "v": Serialized(header, frames)}
        write = asyncio.ensure_future(self.comm.write(message, serializers=SERIALIZERS))
        self.writing.add(write)  # kept until written; a broken comm shows in the read
        write.add_done_callback(self._written)

    def _written(self, write: asyncio.Future) -> None:
        self.writing.discard(write)
        if not write.cancelled() and write.exception() is not None:
            self.comm.abort()

    async def receive(self) -> tuple[int, int, Any]:
        message = await self.comm.read()
        return message["i"], message["t"], message["v"]


def _framing(comm: Any) -> str:
    """How the caller frames a new stream: ``'frames'`` on a Dask TCP comm
    (``tcp://``, ``tls://``), else ``'messages'``; its hello tells the worker."""
    from distributed.comm.tcp import TCP

    return "frames" if isinstance(comm, TCP) and _setting() == "frames" else "messages"


def _setting() -> str:
    """Dask config ``labkv.stream-framing``: ``'frames'`` (the default) or
    ``'messages'``, which makes every stream use ``comm.write``/``comm.read`` (to
    compare the two, and to test the path of the other comms on TCP)."""
    import dask

    return dask.config.get("labkv.stream-framing", "frames")


def _wire(comm: Any, framing: str) -> _Frames | _Messages:
    return _Frames(comm) if framing == "frames" else _Messages(comm)


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


class _Service:
    """The worker's end of every stream into it."""

    def __init__(self, worker: Any):
        self.worker = worker
        self.served = 0  # calls answered, for tests and benchmarks
        self.wires: set = set()  # the streams open into this worker
        self.tasks = TaskGroup()

    async def serve(self, comm: Any, framing: str = "messages", **hello: Any) -> None:
        """Answer every request on ``comm`` until it closes (Dask passes the
        comm to a handler whose first parameter is named ``comm``), framed as
        the caller's hello says (the caller chose, see :func:`_framing`)."""
        wire = _wire(comm, framing)
        self.wires.add(wire)
        try:
            while True:
                seq, _, request = await wire.receive()
                self.tasks.spawn(self._answer(wire, seq, request))
        except (OSError, asyncio.CancelledError):
            pass  # the caller closed its end, or this worker closes
        finally:
            self.wires.discard(wire)

    async def _answer(self, wire: _Frames | _Messages, seq: int, request: tuple) -> None:
        actor_key, method, args = request
        try:
            name = _method(method).name  # only a server's remote methods
            server = self.worker.state.actors.get(actor_key)
            if server is None:
                kind, value = GONE, f"no server {actor_key} on {self.worker.address}"
            else:
                kind, value = RESULT, await dispatch(server, name, args)
        except Exception as exc:
            kind, value = ERROR, portable(exc)
        self.served += 1
        _reply(wire, seq, kind, value)


def _reply(wire: _Frames | _Messages, seq: int, kind: int, value: Any) -> None:
    """Send the answer; one that cannot be pickled is answered as that error; a
    closed comm has nobody left to tell."""
    if wire.comm.closed():
        return
    try:
        wire.send(seq, kind, value)
    except OSError:
        pass
    except Exception as exc:
        error = RuntimeError(f"the server's answer could not be serialised: {exc!r}")
        wire.send(seq, ERROR, error)


# -- the caller's end --------------------------------------------------------------------
class Stream:
    """The open comm of this process (one event loop) to the worker at
    ``address``; every call of the loop to a server there goes through it."""

    def __init__(self, address: str, connection_args: dict):
        self.address, self.connection_args = address, connection_args
        self.comm: Any = None
        self.wire: _Frames | _Messages | None = None
        self.opening: asyncio.Lock | None = None
        self.pending: dict[int, Any] = {}  # asyncio or concurrent futures, by seq
        self.next_seq = 0
        self.readers = TaskGroup()
        self.reachable: bool | None = None  # whether the notebook could open it (see dask.reaches)

    async def call(self, actor_key: str, method: str, args: list) -> Any:
        """``method(*args)`` on the server ``actor_key`` at the far end: its
        result, or the error it raised; ``OSError`` when the stream broke."""
        wire = await self.open()
        reply = asyncio.get_running_loop().create_future()
        seq = self._send(wire, actor_key, method, args, reply)
        try:
            return await reply
        finally:
            self.pending.pop(seq, None)

    def _send(
        self, wire: _Frames | _Messages, actor_key: str, method: str, args: list, reply: Any
    ) -> int:
        """Write the request, its reply to settle ``reply``; its sequence number."""
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        self.pending[seq] = reply
        try:
            wire.send(seq, REQUEST, (actor_key, method, args))
        except BaseException:
            self.pending.pop(seq, None)
            raise
        return seq

    async def open(self, timeout: float | None = None) -> _Frames | _Messages:
        """The open comm's wire, connected first when there is none (or it broke)."""
        if self.opening is None:
            self.opening = asyncio.Lock()
        async with self.opening:
            if self.comm is None or self.comm.closed():
                from distributed.comm import connect

                comm = await connect(
                    self.address, timeout=timeout, name="labkv stream", **self.connection_args
                )
                framing = _framing(comm)
                await comm.write({"op": HANDLER, "reply": False, "framing": framing})
                self.comm, self.wire = comm, _wire(comm, framing)
                self.readers.spawn(_read_replies(self.wire, self.pending, self.address))
        return self.wire

    def start(
        self, actor_key: str, method: str, args: list, future: concurrent.futures.Future
    ) -> None:
        """:meth:`call` for a caller in another thread, run on the loop: the
        request leaves now, with no task, when the comm is open (its reply
        settles ``future`` from the reader), else once it is opened."""
        wire = self.wire
        if wire is None or self.comm.closed():
            task = asyncio.ensure_future(self.call(actor_key, method, args))
            task.add_done_callback(lambda done: _settle(done, future))
            return
        try:
            self._send(wire, actor_key, method, args, future)
        except BaseException as exc:
            future.set_exception(exc)


async def _read_replies(
    wire: _Frames | _Messages, pending: dict[int, asyncio.Future], address: str
) -> None:
    """Hand each reply to its call; when the comm closes, fail the calls still
    waiting (a function, not a method: this task must not keep its
    :class:`Stream` alive)."""
    try:
        while True:
            seq, kind, value = await wire.receive()
            future = pending.pop(seq, None)
            if future is None or future.done():
                continue
            if kind == RESULT:
                future.set_result(value)
            elif kind == ERROR:
                future.set_exception(value)
            else:
                future.set_exception(ServerGone(value))
    except (OSError, asyncio.CancelledError) as exc:
        wire.comm.abort()
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


def _settle(done: asyncio.Future, future: concurrent.futures.Future) -> None:
    """Give ``future`` the outcome of the finished task ``done``."""
    if future.done():
        return
    if done.cancelled():
        future.cancel()
    elif done.exception() is not None:
        future.set_exception(done.exception())
    else:
        future.set_result(done.result())


def start(
    connection_args: dict,
    address: str,
    actor_key: str,
    method: str,
    args: list,
    future: concurrent.futures.Future,
) -> None:
    """``method(*args)`` on the server ``actor_key`` at ``address``, for a caller
    in another thread: called on the loop (``loop.call_soon_threadsafe``), its
    outcome settles ``future``."""
    stream_to(address, connection_args).start(actor_key, method, args, future)


async def call(connection_args: dict, address: str, actor_key: str, method: str, args: list) -> Any:
    """``method(*args)`` on the server ``actor_key`` at ``address``, through
    this loop's stream there."""
    return await stream_to(address, connection_args).call(actor_key, method, args)
