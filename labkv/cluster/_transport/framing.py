"""How a stream's messages are framed on its Dask comm: two wires, one interface.

A message is ``(sequence number, kind, value)``. Every wire has ``send(seq, kind,
value)`` (called on the comm's event loop, or from any thread where its
``any_thread`` is true), ``start(deliver, closed, tasks)``, after which each
message received is handed to ``deliver(seq, kind, value)`` and the end of the
comm to ``closed(error)`` once, ``abort()``, and ``comm``, the Dask comm under it.

- :class:`~.sockets.SocketFrames` (``tcp://`` and ``tls://``, the default): the
  frames of :mod:`.sockets` on the comm's socket itself, taken from tornado.
- :class:`_Messages` (any other comm: ``ucxx://``, ``ws://``, ``inproc://``):
  ``comm.write``/``comm.read``, the value serialised as Dask does.

Whichever it is, the bytes travel on the connection Dask opened, under its TLS and
authentication; the caller chooses (:func:`framing_of`) and its hello tells the worker.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .._tasks import TaskGroup
from .sockets import Closed, Deliver, SocketFrames

#: What Dask may serialise a call's arguments and results with (``_Messages``).
SERIALIZERS = ("dask", "pickle")


# -- Dask's messages --------------------------------------------------------------
class _Messages:
    """Messages through ``comm.write``/``comm.read`` (any Dask comm)."""

    any_thread = False

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

    def abort(self) -> None:
        """Close the connection now."""
        self.comm.abort()

    async def receive(self) -> tuple[int, int, Any]:
        message = await self.comm.read()
        return message["i"], message["t"], message["v"]

    def start(self, deliver: Deliver, closed: Closed, tasks: TaskGroup) -> None:
        tasks.spawn(_pump(self, deliver, closed))


async def _pump(wire: _Messages, deliver: Deliver, closed: Closed) -> None:
    """Hand each message of ``wire`` to ``deliver`` until the comm ends (a
    function, not a method of the caller: it must not keep a stream alive)."""
    try:
        while True:
            deliver(*await wire.receive())
    except (OSError, asyncio.CancelledError) as exc:
        wire.comm.abort()
        closed(exc)


Wire = SocketFrames | _Messages


# -- choosing ---------------------------------------------------------------------------
def framing_of(comm: Any) -> str:
    """How the caller frames a new stream: ``'socket'`` on Dask's TCP comms
    (``tcp://``, ``tls://``), else ``'messages'`` (see :func:`setting`)."""
    from distributed.comm.tcp import TCP

    if not isinstance(comm, TCP) or setting() == "messages":
        return "messages"
    return "socket"


def setting() -> str:
    """Dask config ``labkv.stream-framing``: ``'frames'`` (the default: frames
    on the socket itself on ``tcp://`` and ``tls://``) or ``'messages'``
    (``comm.write``/``comm.read`` everywhere: to compare them, and to test that path
    on TCP).

    >>> import dask
    >>> with dask.config.set({"labkv.stream-framing": "messages"}):
    ...     setting()
    'messages'
    """
    import dask

    chosen = dask.config.get("labkv.stream-framing", "frames")
    if chosen not in ("frames", "messages"):
        raise ValueError(f"labkv.stream-framing is {chosen!r}: use 'frames' or 'messages'")
    return chosen


def wire(comm: Any, framing: str) -> Wire:
    """The wire of a comm whose hello is through (both ends quiet), as its hello's
    ``framing`` says (``'socket'`` or ``'messages'``, see :func:`framing_of`)."""
    if framing == "socket":
        return SocketFrames(comm)
    if framing == "messages":
        return _Messages(comm)
    raise ValueError(f"a stream's hello asks for framing {framing!r}: 'socket' or 'messages'")
