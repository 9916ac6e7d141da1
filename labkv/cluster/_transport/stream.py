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
calls may be in flight at once. A notice is a request the server does not
answer (a rank's barrier arrival at a backup, which nobody waits for).

How a message is framed depends on the comm (:mod:`.framing`): on ``tcp://``
and ``tls://`` both ends read and write their own frames on the comm's socket
itself (on ``tls://`` its ``SSLSocket``), taken from tornado once the hello is
answered; on any other comm (``ucxx://``, ``ws://``, ``inproc://``) messages go
through ``comm.write``/``comm.read``. Either way the bytes travel on Dask's
connection, under its TLS and authentication.

The worker end runs each request as its own task (a pull may wait for other
ranks' pushes while later calls are answered), and only names of the server's
remote methods (:data:`~labkv.cluster._protocol.methods.METHODS`) are called.
A stream that has not yet served a call (to a server on the worker) is only
a hello so far: a worker keeps at most :func:`stream_limits`' first number of
them (the oldest is closed to make room: a real caller sends its first call
right after the hello, so a silent one is the likeliest not to be one) and
closes each that serves none within the second (seconds). So peers that send
the hello and stay silent cannot pin the worker's fds and memory.
A stream that breaks fails its calls in flight with ``OSError`` (the caller
then asks whether the server is lost); the next call opens a new comm.

A rank's plain link to a server on another worker has a stream of its own
(:func:`send_own`), which the loop does not watch: the rank's thread writes its
requests and, while it waits for a reply (:class:`Pumped`), reads the socket
itself. A reply then wakes one thread, the rank's, where a shared stream wakes
the loop, which settles a future that wakes the rank's thread (on 2 cores at 8
ranks, with a 5 ms hold of small pushes, a third of a tiny round's CPU;
docs/performance.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
import weakref
from typing import Any

from .._errors import portable
from .._protocol.methods import method as _method
from .._tasks import TaskGroup
from . import framing as _framing
from .framing import Wire

#: The worker handler at the far end of every stream.
HANDLER = "labkv_stream"
#: Defaults of :func:`stream_limits` (Dask config keys below).
MAX_WAITING_STREAMS = 64
FIRST_CALL_TIMEOUT_S = 30.0


class ServerGone(OSError):
    """The worker has no server of that actor key (released, or never there)."""


# What a message is; a NOTICE is a request whose caller wants no answer.
REQUEST, RESULT, ERROR, GONE, NOTICE = 0, 1, 2, 3, 4
#: The worker's answer to a hello of ``'socket'`` framing: after it, neither end's
#: tornado holds a byte of the stream (see :func:`.framing._take_socket`).
READY = "ready"


# -- the worker's end --------------------------------------------------------------------
def install(worker: Any) -> None:
    """Make ``worker`` answer :data:`HANDLER` (once per worker process); a
    bad :func:`stream_limits` setting fails here, when a server starts, rather
    than at each hello."""
    stream_limits()
    if HANDLER not in worker.handlers:
        worker.handlers[HANDLER] = _Service(worker).serve


def calls_served(dask_worker: Any) -> int:
    """How many calls the streams into ``dask_worker`` have answered (for tests
    and benchmarks: ``client.run(calls_served)``)."""
    handler = dask_worker.handlers.get(HANDLER)
    service = getattr(handler, "__self__", None)
    return service.served if isinstance(service, _Service) else 0


def stream_limits() -> tuple[int, float]:
    """The worker's limits on streams that have not yet served a call: how
    many may be open at once, and for how many seconds each may stay so. Dask
    config ``labkv.stream-max-waiting`` (default 64) and
    ``labkv.stream-first-call-timeout`` (default 30 s; seconds or a duration
    string such as ``"2 minutes"``), read at each hello on the worker.

    >>> import dask
    >>> with dask.config.set({"labkv.stream-max-waiting": 8,
    ...                       "labkv.stream-first-call-timeout": "2s"}):
    ...     stream_limits()
    (8, 2.0)
    >>> with dask.config.set({"labkv.stream-max-waiting": 0}):
    ...     stream_limits()
    Traceback (most recent call last):
    ...
    ValueError: labkv.stream-max-waiting must be a positive int, got 0
    """
    import dask
    from dask.utils import parse_timedelta

    limit = dask.config.get("labkv.stream-max-waiting", MAX_WAITING_STREAMS)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"labkv.stream-max-waiting must be a positive int, got {limit!r}")
    raw = dask.config.get("labkv.stream-first-call-timeout", FIRST_CALL_TIMEOUT_S)
    timeout = parse_timedelta(raw, default="seconds")
    if timeout is None or timeout <= 0:
        raise ValueError(f"labkv.stream-first-call-timeout must be positive, got {raw!r}")
    return limit, float(timeout)


def waiting_streams(dask_worker: Any) -> int:
    """How many streams into ``dask_worker`` have not yet served a call (for
    tests and benchmarks: ``client.run(waiting_streams)``)."""
    handler = dask_worker.handlers.get(HANDLER)
    service = getattr(handler, "__self__", None)
    return len(service.waiting) if isinstance(service, _Service) else 0


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
        # the streams that have not yet served a call, oldest first: their timers
        self.waiting: dict[Any, asyncio.TimerHandle] = {}
        self.tasks = TaskGroup()

    async def serve(self, comm: Any, framing: str = "messages", **hello: Any) -> None:
        """Answer every request on ``comm`` until it closes (Dask passes the
        comm to a handler whose first parameter is named ``comm``), framed as
        the caller's hello says (the caller chose, see :func:`.framing.framing_of`);
        within the limits on streams that have not yet served a call (module doc)."""
        limit, timeout = stream_limits()
        while len(self.waiting) >= limit:  # the oldest silent stream makes room
            oldest = next(iter(self.waiting))
            self.waiting.pop(oldest).cancel()
            oldest.abort()
        if framing == "socket":
            await comm.write(READY)
        if comm.closed():
            return
        wire = _framing.wire(comm, framing)
        ended = asyncio.get_running_loop().create_future()

        def deliver(seq: int, kind: int, request: Any) -> None:
            self.tasks.spawn(self._answer(wire, seq, request, kind == REQUEST))

        def closed(error: BaseException) -> None:
            if not ended.done():
                ended.set_result(None)

        self.wires.add(wire)
        loop = asyncio.get_running_loop()
        self.waiting[wire] = loop.call_later(timeout, self._silent, wire)
        try:
            wire.start(deliver, closed, self.tasks)
            await ended  # until the caller closes its end, or this worker closes
        except asyncio.CancelledError:
            wire.abort()
        finally:
            self.wires.discard(wire)
            timer = self.waiting.pop(wire, None)
            if timer is not None:
                timer.cancel()

    def _silent(self, wire: Wire) -> None:
        """A stream that served no call within the timeout: closed."""
        if self.waiting.pop(wire, None) is not None:
            wire.abort()

    async def _answer(self, wire: Wire, seq: int, request: tuple, answer: bool) -> None:
        actor_key, method, args = request
        try:
            name = _method(method).name  # only a server's remote methods
            server = self.worker.state.actors.get(actor_key)
            if server is None:
                kind, value = GONE, f"no server {actor_key} on {self.worker.address}"
            else:
                if self.waiting:  # a call to a server here: the stream serves
                    timer = self.waiting.pop(wire, None)
                    if timer is not None:
                        timer.cancel()
                kind, value = RESULT, await dispatch(server, name, args)
        except Exception as exc:
            kind, value = ERROR, portable(exc)
        self.served += 1
        if answer:
            _reply(wire, seq, kind, value)


def _reply(wire: Wire, seq: int, kind: int, value: Any) -> None:
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

    def __init__(self, address: str, connection_args: dict, watched: bool = True):
        self.address, self.connection_args = address, connection_args
        self.watched = watched  # else read by the thread that waits (see Pumped)
        self.pumped = False  # whether the open wire is read by the waiting thread
        self.comm: Any = None
        self.wire: Wire | None = None
        self.opening: asyncio.Lock | None = None
        self.pending: dict[int, Any] = {}  # asyncio or concurrent futures, by seq
        self.next_seq = 0
        self.numbering = threading.Lock()  # calls may be sent from other threads too
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

    def _send(self, wire: Wire, actor_key: str, method: str, args: list, reply: Any) -> int:
        """Write the request, its reply to settle ``reply`` (None: a notice,
        answered by nobody); its sequence number."""
        with self.numbering:
            seq, self.next_seq = self.next_seq, self.next_seq + 1
            if reply is not None:
                self.pending[seq] = reply
        try:
            wire.send(seq, REQUEST if reply is not None else NOTICE, (actor_key, method, args))
        except BaseException:
            self.pending.pop(seq, None)
            raise
        return seq

    async def open(self, timeout: float | None = None) -> Wire:
        """The open comm's wire, connected first when there is none (or it broke)."""
        if self.opening is None:
            self.opening = asyncio.Lock()
        async with self.opening:
            if self.comm is None or self.comm.closed() or _ended(self.wire):
                from distributed.comm import connect

                comm = await connect(
                    self.address, timeout=timeout, name="labkv stream", **self.connection_args
                )
                framing = _framing.framing_of(comm)
                try:
                    await comm.write({"op": HANDLER, "reply": False, "framing": framing})
                    # on the socket, nothing more is written before the worker is ready
                    if framing == "socket" and await comm.read() != READY:
                        raise OSError(f"the worker at {self.address} did not take the stream")
                except BaseException:  # a refused hello, or a caller that gave up waiting
                    comm.abort()
                    raise
                wire = _framing.wire(comm, framing)
                deliver, closed = _replies(self.pending, self.address)
                self.pumped = not self.watched and hasattr(wire, "pump")
                if self.pumped:
                    wire.start(deliver, closed, self.readers, watched=False)
                else:
                    wire.start(deliver, closed, self.readers)
                self.comm, self.wire = comm, wire
        return self.wire

    def close(self) -> None:
        """Close the comm (from any thread): its calls in flight fail."""
        wire = self.wire
        if wire is not None:
            wire.abort()

    def request(self, actor_key: str, method: str, args: list) -> asyncio.Future:
        """:meth:`call` as a future, for a caller on the loop: the request is
        written now when the comm is open, with no task, else once it is opened."""
        wire = self.wire
        if wire is None or self.comm.closed():
            return asyncio.ensure_future(self.call(actor_key, method, args))
        reply = asyncio.get_running_loop().create_future()
        self._send_settling(wire, actor_key, method, args, reply)
        return reply

    def start(
        self, actor_key: str, method: str, args: list, future: concurrent.futures.Future | None
    ) -> None:
        """:meth:`call` for a caller in another thread, run on the loop: the
        request leaves now, with no task, when the comm is open (its reply
        settles ``future`` from the reader), else once it is opened (``future``
        None: a notice, whose answer, if any, nobody reads)."""
        wire = self.wire
        if wire is None or self.comm.closed():
            task = asyncio.ensure_future(self.call(actor_key, method, args))
            if future is not None:
                task.add_done_callback(lambda done: _settle(done, future))
            else:  # its outcome is read, so that asyncio does not log it as lost
                task.add_done_callback(lambda done: done.cancelled() or done.exception())
            return
        self._send_settling(wire, actor_key, method, args, future)

    def send_here(
        self, actor_key: str, method: str, args: list, future: concurrent.futures.Future | None
    ) -> bool:
        """:meth:`start` from the calling thread itself, when the stream is open
        on a wire any thread may write; whether it was (else nothing was done)."""
        wire = self.wire
        if wire is None or not wire.any_thread or self.comm.closed() or _ended(wire):
            return False
        self._send_settling(wire, actor_key, method, args, future)
        return True

    def _send_settling(
        self, wire: Wire, actor_key: str, method: str, args: list, future: Any
    ) -> None:
        """:meth:`_send`, a request that cannot be sent failing ``future``."""
        try:
            self._send(wire, actor_key, method, args, future)
        except BaseException as exc:
            _fail(future, exc)


def _ended(wire: Wire | None) -> bool:
    """Whether ``wire`` has ended (its comm may close a moment later, on the loop)."""
    return getattr(wire, "ended", None) is not None


def on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether this thread is running ``loop`` (where waiting for a call on it
    would deadlock)."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:  # no loop runs in this thread
        return False


def _fail(future: Any, error: BaseException) -> None:
    """Fail ``future`` unless it is already done (the comm's end may have failed
    it); a notice's (None) failure has nobody to tell."""
    if future is None:
        return
    try:
        if not future.done():
            future.set_exception(error)
    except (concurrent.futures.InvalidStateError, asyncio.InvalidStateError):
        pass


def _replies(pending: dict[int, Any], address: str) -> tuple:
    """The ``(deliver, closed)`` of a caller's wire: each reply settles its call's
    future; when the comm closes, the calls still waiting fail with ``OSError``
    (functions, not methods: the wire must not keep its :class:`Stream` alive)."""

    def deliver(seq: int, kind: int, value: Any) -> None:
        future = pending.pop(seq, None)
        if future is None or future.done():
            return
        if kind == RESULT:
            future.set_result(value)
        elif kind == ERROR:
            future.set_exception(value)
        else:
            future.set_exception(ServerGone(value))

    def closed(error: BaseException) -> None:
        for future in list(pending.values()):
            _fail(future, OSError(f"the stream to {address} closed: {error!r}"))

    return deliver, closed


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


def send(
    loop: asyncio.AbstractEventLoop,
    connection_args: dict,
    address: str,
    actor_key: str,
    method: str,
    args: list,
    future: concurrent.futures.Future | None,
) -> None:
    """``method(*args)`` on the server ``actor_key`` at ``address``, for a
    caller in any thread, its outcome settling ``future`` (None: a notice,
    not answered): the request is written from
    this thread when ``loop``'s stream to ``address`` is open on a socket any
    thread may write (no hand-off to the loop), else handed to the loop."""
    stream = _STREAMS.get(loop, {}).get(address)
    if stream is None or not stream.send_here(actor_key, method, args, future):
        loop.call_soon_threadsafe(_start, connection_args, address, actor_key, method, args, future)


#: Seconds a rank's own stream may take to open (connect and hello).
OPEN_S = 30.0


class Pumped:
    """The future of a call on an unwatched stream (:func:`send_own`): waiting
    for it reads the stream in the waiting thread (see :class:`~.base.Waitable`)."""

    __slots__ = ("future", "stream")

    def __init__(self, future: concurrent.futures.Future, stream: Stream):
        self.future, self.stream = future, stream

    def result(self, timeout: float | None = None) -> Any:
        self._pump(timeout)
        return self.future.result(0)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._pump(timeout)
        return self.future.exception(0)

    def done(self) -> bool:
        if not self.future.done():
            self.read_until_answered(0.0)  # what has arrived; never waits
        return self.future.done()

    def add_done_callback(self, callback: Any) -> None:
        self.future.add_done_callback(callback)

    def read_until_answered(self, timeout: float | None) -> None:
        """Read the stream until the call is answered, or ``timeout``."""
        with contextlib.suppress(concurrent.futures.TimeoutError):
            self._pump(timeout)

    def _pump(self, timeout: float | None) -> None:
        """Read the stream until the future is done, or ``timeout`` (then
        ``TimeoutError``, as a future's ``result``)."""
        future = self.future
        deadline = None if timeout is None else time.monotonic() + timeout
        while not future.done():  # reads at least once, even with timeout 0
            left = 3600.0 if deadline is None else max(0.0, deadline - time.monotonic())
            stream = self.stream
            wire = stream.wire
            if wire is None or not stream.pumped or wire.ended is not None:
                # not open yet, or read (or ended) on the loop
                concurrent.futures.wait([future], min(left, 0.05))
            else:
                wire.pump(min(left, 1.0))
            if not future.done() and deadline is not None and time.monotonic() >= deadline:
                raise concurrent.futures.TimeoutError()


def send_own(
    stream: Stream,
    loop: asyncio.AbstractEventLoop,
    actor_key: str,
    method: str,
    args: list,
    future: concurrent.futures.Future | None,
) -> None:
    """``method(*args)`` on the server ``actor_key`` through ``stream``, a
    caller's own unwatched stream on ``loop``: written from this thread when it
    is open, else opened on the loop first (waited for up to :data:`OPEN_S`
    from another thread, so that calls leave in order; handed over from the
    loop's own). Its reply settles ``future`` when the caller waits for it."""
    if stream.send_here(actor_key, method, args, future):
        return
    opening = _open_and_send(stream, actor_key, method, args, future)
    if on_loop(loop):
        asyncio.ensure_future(opening)
        return
    started = asyncio.run_coroutine_threadsafe(opening, loop)
    try:
        started.result(OPEN_S)
    except concurrent.futures.TimeoutError:
        started.cancel()
        _fail(future, OSError(f"no stream to {stream.address} opened within {OPEN_S:g} s"))


async def _open_and_send(
    stream: Stream, actor_key: str, method: str, args: list, future: Any
) -> None:
    try:
        wire = await asyncio.wait_for(stream.open(), OPEN_S)
    except Exception as exc:
        _fail(future, exc if isinstance(exc, OSError) else OSError(repr(exc)))
        return
    stream._send_settling(wire, actor_key, method, args, future)


def _start(connection_args: dict, address: str, *call: Any) -> None:
    """:meth:`Stream.start` of this loop's stream to ``address`` (on the loop)."""
    stream_to(address, connection_args).start(*call)


def request(
    connection_args: dict, address: str, actor_key: str, method: str, args: list
) -> asyncio.Future:
    """``method(*args)`` on the server ``actor_key`` at ``address``, through
    this loop's stream there: its reply's future (see :meth:`Stream.request`)."""
    return stream_to(address, connection_args).request(actor_key, method, args)
