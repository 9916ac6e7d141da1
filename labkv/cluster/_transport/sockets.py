"""A stream's frames on the comm's socket itself (``tcp://`` and ``tls://``).

Once a stream's hello is answered, the socket of its Dask TCP or TLS comm (an
``ssl.SSLSocket`` on ``tls://``, its session set up by Dask) is taken from
tornado (:func:`_take_socket`) and read and written directly from the event
loop's own reader and writer callbacks (:class:`SocketFrames`). A message is a
fixed header (sequence number, kind, body bytes, buffer count), the buffers'
sizes, the body pickled with protocol 5, then each out-of-band buffer (a numpy
array's memory) as it is: written with one ``sendmsg`` (no copy, no join; on
TLS, small pieces joined into one record), read with one ``recv_into`` when it
is small and straight into its array when it is big. Tornado's ``IOStream``
re-registers the socket with the loop around each read and write and resolves
a future per read: about a third of a tiny call's CPU on both ends, measured
when the same frames still went through it (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import collections
import math
import pickle
import select
import socket
import ssl
import struct
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from cloudpickle import list_registry_pickle_by_value

#: The frame's fixed header: sequence number, kind, body bytes, buffer count.
HEAD = struct.Struct("<QBIH")
#: At most this many pieces go to one ``sendmsg`` (Linux's IOV_MAX is 1024).
MAX_PIECES = 512
#: A read takes at most this many bytes when no big buffer is being filled.
READ_CHUNK = 256 << 10
#: On TLS, pieces smaller than this are joined into one write (one record).
TLS_JOIN = 64 << 10

Deliver = Callable[[int, int, Any], None]
Closed = Callable[[BaseException], None]


def pickled(value: Any) -> tuple[bytes, list[memoryview]]:
    """``value`` pickled: the body, and each out-of-band buffer's memory (not copied).

    Dask's ``pickle.dumps`` first, too, tries the standard pickle, and takes
    cloudpickle only for what it refuses, for a body naming ``__main__`` and
    when modules are registered to go by value; but before it takes the
    standard pickle's body it looks up the value's module (``inspect.getmodule``,
    a tenth of a small message's cost here). That is only needed while a module
    is registered, so the standard pickle's body is taken here at once otherwise.

    >>> body, raws = pickled(("server-0", "pull", [np.arange(3.0)]))
    >>> unpickled(body, [np.frombuffer(r, np.uint8) for r in raws])[2][0]
    array([0., 1., 2.])
    >>> import pickle
    >>> pickle.loads(pickled(lambda x: x + 1)[0])(1)  # cloudpickle's, as Dask sends it
    2
    """
    buffers: list = []
    if not list_registry_pickle_by_value():
        try:
            body = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
        except Exception:
            buffers.clear()
        else:
            if b"__main__" not in body:
                return body, [b.raw() for b in buffers]
            buffers.clear()
    from distributed.protocol import pickle as dask_pickle

    body = dask_pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    return body, [b.raw() for b in buffers]


def header(seq: int, kind: int, body: bytes, raws: list) -> bytes:
    """A frame's header and its buffers' sizes, before ``body`` and ``raws``."""
    sizes = struct.pack(f"<{len(raws)}Q", *(r.nbytes for r in raws))
    return HEAD.pack(seq, kind, len(body), len(raws)) + sizes


def unpickled(body: Any, buffers: list) -> Any:
    """The value of a frame's body and buffers."""
    return pickle.loads(body, buffers=buffers)


def _take_socket(comm: Any, on_closed_by_dask: Callable[[], None]) -> socket.socket:
    """Take the socket of a Dask TCP or TLS comm from tornado, which must have
    nothing buffered or pending (both ends wait for the hello's answer before
    writing): tornado stops watching it and is left a placeholder socket of its
    own. The comm stays the connection's owner: aborting it (Dask does when the
    worker closes) closes the placeholder and calls ``on_closed_by_dask``, which
    closes the real one, after this end stopped watching it."""
    io = comm.stream
    io.set_close_callback(on_closed_by_dask)
    io.io_loop.remove_handler(io.socket)
    sock, io.socket = io.socket, socket.socket()
    return sock


class SocketFrames:
    """Frames on the comm's socket, read by the loop's callbacks (see module doc).
    Any thread may send: a message is written at once from the sending thread
    when the socket takes it (a rank's call needs no hand-off to the loop), and
    what it does not take is written by the loop's writer callback. ``lock``
    keeps the writes whole and in order, and the socket open while one is made.
    An unwatched wire (``start(..., watched=False)``) is read by whoever calls
    :meth:`pump`, one thread at a time; the loop still writes what the socket
    did not take, and closes the socket."""

    #: whether a thread other than the loop's may call :meth:`send`
    any_thread = True

    def __init__(self, comm: Any):
        self.comm = comm
        self.loop = asyncio.get_running_loop()
        self.loop_thread = threading.get_ident()
        self.lock = threading.Lock()
        self.sock = _take_socket(comm, self._closed_by_dask)
        # An SSL connection must not be read and written by two threads at once:
        # on TLS a read holds ``lock`` as a write does; small pieces go as one record.
        self.tls = isinstance(self.sock, ssl.SSLSocket)
        self.fd = self.sock.fileno()
        self.outbox: collections.deque[memoryview] = collections.deque()  # not yet written
        self.inbox = bytearray()  # read, not yet a whole message's head and body
        # what a read takes (READ_CHUNK bytes), made at the first read: a stream
        # that never sends holds none of it
        self.scratch: memoryview | None = None
        # (seq, kind, body, sizes, buffers) of a message while its buffers arrive
        self.message: tuple | None = None
        # a big buffer being read in place, and its bytes so far
        self.filling: tuple[np.ndarray, int] | None = None
        self.deliver: Deliver | None = None
        self.on_closed: Closed | None = None
        self.ended: BaseException | None = None
        # an unwatched wire's (see pump): its poll of the socket, one reader at a time
        self.poller: select.poll | None = None
        self.reading = threading.Lock()

    # writing
    def send(self, seq: int, kind: int, value: Any) -> None:
        """Write a message (from any thread), at once when the socket takes it,
        else from the loop's writer callback; ``OSError`` when the stream has closed."""
        body, raws = pickled(value)
        pieces = [memoryview(p) for p in (header(seq, kind, body, raws), body, *raws)]
        with self.lock:
            if self.ended is not None:
                raise OSError(f"the stream is closed: {self.ended!r}")
            behind = bool(self.outbox)  # earlier bytes wait for the writer
            self.outbox.extend(pieces)
            if behind:
                return
            error = self._write()
        if error is not None:
            self._call_on_loop(self._end, error)
        elif self.outbox:
            self._call_on_loop(self._arm_writer)

    def _write(self) -> OSError | None:
        """Write what the outbox holds, as far as the socket takes it (under
        ``lock``); the error that broke the connection, if one did."""
        outbox = self.outbox
        while outbox:
            try:
                sent = self._send_some(outbox)
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                return None
            except OSError as exc:
                return exc
            while sent:
                first = outbox[0]
                if sent >= first.nbytes:
                    sent -= first.nbytes
                    outbox.popleft()
                else:
                    outbox[0] = first[sent:]
                    sent = 0
            while outbox and outbox[0].nbytes == 0:  # an empty buffer counts as sent
                outbox.popleft()
        return None

    def _send_some(self, outbox: collections.deque) -> int:
        """One write of the outbox's first pieces; the bytes it took."""
        if not self.tls:
            return self.sock.sendmsg([outbox[i] for i in range(min(len(outbox), MAX_PIECES))])
        first = outbox[0]
        if first.nbytes < TLS_JOIN and len(outbox) > 1:  # small pieces: one record
            joined, size = [], 0
            for piece in outbox:
                if size + piece.nbytes > TLS_JOIN:
                    break
                joined.append(piece)
                size += piece.nbytes
            first = memoryview(b"".join(joined))
        return self.sock.send(first)

    def _call_on_loop(self, callback: Callable[..., None], *args: Any) -> None:
        if threading.get_ident() == self.loop_thread:
            callback(*args)
        else:
            self.loop.call_soon_threadsafe(callback, *args)

    def _arm_writer(self) -> None:
        with self.lock:
            if self.ended is None and self.outbox:
                self.loop.add_writer(self.fd, self._writable)

    def _writable(self) -> None:
        with self.lock:
            error = self._write()
            if error is None and not self.outbox:
                self.loop.remove_writer(self.fd)
        if error is not None:
            self._end(error)

    # reading
    def start(
        self, deliver: Deliver, closed: Closed, tasks: Any = None, watched: bool = True
    ) -> None:
        """Hand every message to ``deliver`` and the end to ``closed`` from now on:
        read by the loop's reader (``watched``), else by whoever calls :meth:`pump`."""
        self.deliver, self.on_closed = deliver, closed
        if watched:
            self.loop.add_reader(self.fd, self._readable)
        else:
            self.poller = select.poll()
            self.poller.register(self.fd, select.POLLIN)

    def pump(self, timeout: float) -> None:
        """Read what has arrived, waiting up to ``timeout`` seconds for it (an
        unwatched wire, from the thread that waits for its replies)."""
        if self.ended is not None or not self.reading.acquire(timeout=timeout):
            return
        try:
            if self.ended is None and self.poller.poll(math.ceil(max(0.0, timeout) * 1000)):
                self._readable()
        finally:
            self.reading.release()

    def _readable(self) -> None:
        if self.ended is not None:
            return
        try:
            got = self._read()
            # TLS: a read takes at most one record (16 KiB); read on until the
            # socket has no more (SSLWantReadError), not one loop iteration a record
            while got and self.tls and self.ended is None:
                got = self._read()
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except Exception as exc:  # a broken connection, or bytes that are no message
            self._end(exc)
            return
        if not got:
            self._end(OSError("the other end closed the stream"))

    def _read(self) -> int:
        """One read, into the big buffer being filled or the inbox; the bytes it took."""
        if self.filling is not None:
            array, filled = self.filling
            got = self._recv_into(memoryview(array)[filled:])
            if got:
                self._filled(array, filled + got)
        else:
            scratch = self.scratch
            if scratch is None:
                scratch = self.scratch = memoryview(bytearray(READ_CHUNK))
            got = self._recv_into(scratch)
            if got:
                self.inbox += scratch[:got]
                self._parse()
        return got

    def _recv_into(self, view: memoryview) -> int:
        if not self.tls:
            return self.sock.recv_into(view)
        with self.lock:  # not while another thread writes the SSL connection
            return self.sock.recv_into(view)

    def _filled(self, array: np.ndarray, filled: int) -> None:
        if filled < array.nbytes:
            self.filling = (array, filled)
            return
        self.filling = None
        self.message[4].append(array)
        self._parse()

    def _parse(self) -> None:
        """Take every whole message the inbox holds; a big buffer that has not
        all arrived is read in place from then on."""
        inbox = self.inbox
        while True:
            if self.message is None:
                if len(inbox) < HEAD.size:
                    return
                seq, kind, nbody, nbuffers = HEAD.unpack_from(inbox)
                start = HEAD.size + 8 * nbuffers
                if len(inbox) < start + nbody:
                    return
                sizes = struct.unpack_from(f"<{nbuffers}Q", inbox, HEAD.size)
                body = bytes(inbox[start : start + nbody])
                del inbox[: start + nbody]
                self.message = (seq, kind, body, sizes, [])
            seq, kind, body, sizes, buffers = self.message
            while len(buffers) < len(sizes):
                size = sizes[len(buffers)]
                array = np.empty(size, np.uint8)
                have = min(size, len(inbox))
                with memoryview(inbox) as view:
                    memoryview(array)[:have] = view[:have]
                del inbox[:have]
                if have < size:
                    self.filling = (array, have)
                    return
                buffers.append(array)
            self.message = None
            self.deliver(seq, kind, unpickled(body, buffers))

    # ending
    def abort(self) -> None:
        """Close the connection now (on the loop)."""
        self._end(OSError("the stream was closed"))

    def _closed_by_dask(self) -> None:
        self._end(OSError("the comm was closed"))

    def _end(self, error: BaseException) -> None:
        """Close this end once (on the loop): the socket, the comm, then tell ``closed``."""
        with self.lock:
            if self.ended is not None:
                return
            self.ended = error
            self.outbox.clear()
            # the buffers now, not at the cyclic GC that frees this wire (the comm's
            # close callback and this object refer to each other)
            self.scratch, self.inbox, self.message, self.filling = None, bytearray(), None, None
        try:
            self._call_on_loop(self._close)
        except RuntimeError:  # the loop has closed (its worker stopped): nothing watches
            self.sock.close()
        if self.on_closed is not None:
            self.on_closed(error)

    def _close(self) -> None:
        """The socket and the comm, on the loop (its selector is the loop's own)."""
        self.loop.remove_reader(self.fd)
        self.loop.remove_writer(self.fd)
        self.sock.close()
        self.comm.abort()
