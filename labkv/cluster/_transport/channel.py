"""A primary's small log entries to a backup, on one plain socket per backup.

Why not an actor call: a tiny dist_sync round of two ranks is otherwise one
actor call between the workers (a rank's push rides on its pull), and
forwarding its entry as a second one nearly doubled the round's CPU on a
2-core machine, where that CPU is the round's time. Measured between two
processes here, an echo over Dask's RPC costs about 0.2 ms of CPU on each
side (framing, msgpack, serialisation, the comm's read and write machinery),
and an actor call adds the worker's actor dispatch on top; the same echo on
a plain asyncio socket costs about 0.05 ms on each side. On a
:class:`Channel` an entry is one write of a fixed header, the server's actor
key and the entry's pickled bytes, and its reply one short write back.

What travels here: a ``replicate`` call whose entry holds no big value (see
:func:`~labkv.cluster._protocol.entries.encode_entry`); big values are bandwidth, which Dask's frames
carry without a copy, so they stay actor calls, as does every call when no
channel can be opened (a comm other than ``tcp://`` or ``tls://``, a listener
that cannot be reached). A channel that breaks fails its calls in flight with
``OSError``; :meth:`~labkv.cluster._transport.dask.DaskHost.call_peer` then makes the same call
as an actor call, which finds out whether the backup is alive (a backup
applies an entry it already has as a no-op).

The listener: one per worker process, started when a peer first asks for its
address through the worker handler :data:`HANDLER` (a Dask RPC, over the
cluster's own security). The answer carries a random token that each
connection must send first, so only a peer that may already call the
worker's handlers can send entries. With ``tls://`` the socket uses the
worker's own TLS contexts.

What a stranger can do to the listener is bounded: a connection must send
the token within :data:`TOKEN_TIMEOUT_S`, at most
:data:`MAX_UNAUTHENTICATED` connections may wait to do so (more are closed
at once, so a flood cannot use up the worker's file descriptors), and a
frame announcing more than :data:`MAX_KEY_BYTES` of actor key or
:data:`MAX_BLOB_BYTES` of entry closes its connection before anything is
read (bigger entries go as actor calls). The listener accepts at most
``_BACKLOG`` connections at a time, so its descriptors stay bounded. Such refusals are logged once per
listener, at warning level, not as a traceback per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import struct
import weakref
from typing import Any

from .._errors import deposed, is_deposed
from .._tasks import TaskGroup

#: The worker handler that answers a channel listener's ``(host, port, token)``.
HANDLER = "labkv_channel"

_CALL = struct.Struct("<QQII")  # call id, entry index, actor key bytes, entry blob bytes
_REPLY = struct.Struct("<QBI")  # call id, status, error message bytes
_FAILED, _OK, _DEPOSED = 0, 1, 2  # the statuses: the backup's answer deposes the primary
_TOKEN_BYTES = 16

#: Seconds a new connection has to send its token.
TOKEN_TIMEOUT_S = 5.0
#: Connections that may wait to send their token at once; more are closed.
MAX_UNAUTHENTICATED = 64
#: The longest actor key and entry a frame may announce (longer ones close it).
MAX_KEY_BYTES = 1 << 10
MAX_BLOB_BYTES = 64 << 20
# Connections accepted in one go: with the waiting ones, what the listener can
# hold open at once stays far below a worker's descriptor limit.
_BACKLOG = 16

logger = logging.getLogger(__name__)


def install(worker: Any) -> None:
    """Make ``worker`` answer :data:`HANDLER` (once per worker process)."""
    if HANDLER not in worker.handlers:
        worker.handlers[HANDLER] = _Listener(worker).address


def entries_served(dask_worker: Any) -> int:
    """How many log entries the channels into ``dask_worker`` have applied
    (for tests and benchmarks: ``client.run(entries_served)``)."""
    handler = dask_worker.handlers.get(HANDLER)
    listener = getattr(handler, "__self__", None)
    return listener.served if isinstance(listener, _Listener) else 0


def _scheme_and_host(address: str) -> tuple[str, str]:
    from distributed.comm import parse_address, parse_host_port

    scheme, location = parse_address(address)
    return scheme, parse_host_port(location)[0]


class _Listener:
    """The worker's listening socket, started on the first ask."""

    def __init__(self, worker: Any):
        self.worker = worker
        self.token = secrets.token_bytes(_TOKEN_BYTES)
        self.bound: tuple[str, int] | None = None
        self.failed = False  # the worker's host cannot be bound here (a NAT'd address)
        self.starting: asyncio.Lock | None = None
        self.served = 0  # entries applied from channels, for tests and benchmarks
        self.connections: set[asyncio.StreamWriter] = set()
        self.unauthenticated = 0  # connections that have not sent the token yet
        self.refused = 0  # connections closed unread: no token in time, too many, bad frames

    async def address(self) -> tuple[str, int, bytes] | None:
        """``(host, port, token)``, or None when this worker's comm is not TCP."""
        scheme, host = _scheme_and_host(self.worker.address)
        if scheme not in ("tcp", "tls"):
            return None
        if self.starting is None:
            self.starting = asyncio.Lock()
        async with self.starting:
            if self.bound is None and not self.failed:
                ssl = None
                if scheme == "tls":
                    ssl = self.worker.security.get_listen_args("worker")["ssl_context"]
                try:
                    self.server = await asyncio.start_server(
                        self._serve, host, 0, ssl=ssl, backlog=_BACKLOG
                    )
                except OSError:
                    self.failed = True
                    return None
                self.bound = (host, self.server.sockets[0].getsockname()[1])
        return None if self.bound is None else (*self.bound, self.token)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Run every call on one connection as it arrives (an entry may wait for
        the one before it), answering each when it is done."""
        running = TaskGroup()
        self.connections.add(writer)
        try:
            if not await self._authenticated(reader):
                return
            while True:
                call_id, index, key_len, blob_len = _CALL.unpack(
                    await reader.readexactly(_CALL.size)
                )
                if key_len > MAX_KEY_BYTES or blob_len > MAX_BLOB_BYTES:
                    self._refuse(f"a frame of {key_len} + {blob_len} bytes")
                    return
                actor_key = (await reader.readexactly(key_len)).decode()
                blob = await reader.readexactly(blob_len)
                running.spawn(self._answer(writer, call_id, actor_key, (index, blob, [])))
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the primary closed the channel, its worker died, or this one closes
        except Exception as exc:  # a malformed stream: close it, quietly
            self._refuse(f"a malformed stream ({type(exc).__name__})")
        finally:
            self.connections.discard(writer)
            writer.close()

    async def _authenticated(self, reader: asyncio.StreamReader) -> bool:
        """Whether the connection sends the token in time (see module doc)."""
        if self.unauthenticated >= MAX_UNAUTHENTICATED:
            self._refuse(f"more than {MAX_UNAUTHENTICATED} connections without a token")
            return False
        self.unauthenticated += 1
        try:
            token = await asyncio.wait_for(reader.readexactly(_TOKEN_BYTES), TOKEN_TIMEOUT_S)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, OSError):
            self._refuse(f"no token within {TOKEN_TIMEOUT_S:g} s")
            return False
        finally:
            self.unauthenticated -= 1
        if not secrets.compare_digest(token, self.token):
            self._refuse("a wrong token")
            return False
        return True

    def _refuse(self, why: str) -> None:
        """Count a connection closed unread; log the first of them only."""
        self.refused += 1
        if self.refused == 1:
            logger.warning(
                "labkv's replication listener on %s closed a connection: %s (later ones "
                "are counted, not logged)",
                self.worker.address,
                why,
            )

    async def _answer(
        self, writer: asyncio.StreamWriter, call_id: int, actor_key: str, entry: tuple
    ) -> None:
        try:
            server = self.worker.state.actors.get(actor_key)
            if server is None:
                raise RuntimeError(f"no server {actor_key} on {self.worker.address}")
            await server.replicate(entry)
            self.served += 1
            reply = _REPLY.pack(call_id, _OK, 0)
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}".encode()
            status = _DEPOSED if is_deposed(exc) else _FAILED
            reply = _REPLY.pack(call_id, status, len(message)) + message
        if not writer.is_closing():
            writer.write(reply)


class Channel:
    """One open connection from a server to a backup's worker listener.
    Calls may overlap; each reply names its call. It closes when this object
    is collected (its server released); a broken one fails every call in
    flight with ``OSError``, and the next call opens a new connection."""

    def __init__(self, worker: Any, address: str):
        self.worker, self.address = worker, address
        self.writer: asyncio.StreamWriter | None = None
        self.opening: asyncio.Lock | None = None
        self.pending: dict[int, asyncio.Future] = {}
        self.next_id = 0
        self.unavailable = False  # no listener there: every call goes as an actor call
        self._finalizer: Any = None

    async def replicate(self, actor_key: str, entry: tuple) -> None:
        """``replicate(entry)`` on the server ``actor_key`` at the other end
        (an entry without big values: ``entry[2]`` is empty)."""
        index, blob, bigs = entry
        assert not bigs, "big values travel as actor calls"
        writer = await self._open()
        call_id, self.next_id = self.next_id, self.next_id + 1
        reply = self.pending[call_id] = asyncio.get_running_loop().create_future()
        key = actor_key.encode()
        try:
            writer.write(_CALL.pack(call_id, index, len(key), len(blob)) + key + blob)
            await reply
        finally:
            self.pending.pop(call_id, None)

    async def _open(self) -> asyncio.StreamWriter:
        if self.opening is None:
            self.opening = asyncio.Lock()
        async with self.opening:
            if self.writer is None or self.writer.is_closing():
                self.writer = await self._connect()
        return self.writer

    async def _connect(self) -> asyncio.StreamWriter:
        scheme, _ = _scheme_and_host(self.address)
        try:
            where = await getattr(self.worker.rpc(self.address), HANDLER)()
        except OSError:
            raise
        except Exception:  # a worker without the handler
            where = None
        if where is None:
            self.unavailable = True
            raise OSError(f"no labkv channel on {self.address}")
        host, port, token = where
        ssl = None
        if scheme == "tls":
            ssl = self.worker.connection_args["ssl_context"]
        try:
            reader, writer = await asyncio.open_connection(host, port, ssl=ssl)
        except OSError:
            self.unavailable = True  # a listener we cannot reach (behind a NAT, say)
            raise
        writer.write(token)
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _close_soon, asyncio.get_running_loop(), writer)
        _READERS.spawn(_read_replies(reader, writer, self.pending))
        return writer


def _close_soon(loop: asyncio.AbstractEventLoop, writer: asyncio.StreamWriter) -> None:
    """Close ``writer`` on its loop (a finalizer runs in whichever thread
    collects the channel); with the loop closed, its socket is gone already."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(writer.close)


_READERS = TaskGroup()  # every channel's reply reader


async def _read_replies(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pending: dict[int, asyncio.Future]
) -> None:
    """Hand each reply to its call; when the connection closes, fail the calls
    still waiting (a function, not a method: this task must not keep its
    :class:`Channel` alive)."""
    try:
        while True:
            call_id, status, length = _REPLY.unpack(await reader.readexactly(_REPLY.size))
            message = (await reader.readexactly(length)).decode() if length else ""
            reply = pending.get(call_id)
            if reply is None or reply.done():
                continue
            if status == _OK:
                reply.set_result(None)
            elif status == _DEPOSED:
                reply.set_exception(deposed(message))
            else:
                reply.set_exception(RuntimeError(message))
    except (OSError, asyncio.IncompleteReadError) as exc:
        writer.close()
        for reply in list(pending.values()):
            if not reply.done():
                reply.set_exception(OSError(f"the channel to a backup closed: {exc!r}"))
