"""Small pushes a rank holds back, to fold them into its next pull.

A push that is not waited for (below :data:`.calls.ACK_ABOVE` bytes)
and that would travel as one frame is held instead of sent: if the rank's
next call is a pull of the same server, the push rides along in the pull's
message (one message each way per push+pull instead of two, on both event
loops). Every held push leaves by ONE exit, :meth:`Holding.release`:

- a pull calls ``release(carry=its servers)``: the pushes for those servers
  come back to ride in the pull (their futures succeed now: the pull answers
  for them from then on), the others are sent;
- any other call of the rank calls ``release()`` first, so every call sees the
  rank's earlier pushes;
- a timer on the link's event loop calls ``release()`` once the oldest push has
  waited ``hold_s`` (another rank's dist_sync round never waits longer than
  that for it). It is armed once per burst of pushes and re-arms itself while
  pushes keep coming (no hand-off to the loop per push).

Each held push has a future that settles as its send does; the rank keeps it
with its other in-flight pushes, so a held push's error surfaces as a sent
one's would.

>>> sent = []
>>> h = Holding(lambda s, msg: sent.append((s, msg)) or _done(), loop=None)
>>> f0, f1 = h.hold(0, "a"), h.hold(1, "b")
>>> h.release(carry={1}), sent, f1.done()
({1: ['b']}, [(0, 'a')], True)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

#: A held push goes out on its own after at most this long.
HOLD_S = 0.005


def _done() -> concurrent.futures.Future:
    f: concurrent.futures.Future = concurrent.futures.Future()
    f.set_result(None)
    return f


def _settle(src: Any, dst: concurrent.futures.Future) -> None:
    """Give ``dst`` the outcome of the finished call ``src`` (a done-callback)."""
    if dst.done():
        return
    try:
        exc = src.exception()
    except BaseException as cancelled:  # CancelledError
        exc = cancelled
    if exc is None:
        dst.set_result(None)
    else:
        dst.set_exception(exc)


class _Held(concurrent.futures.Future):
    """A held push's future. Once the push is sent, waiting for it first reads
    the replies of its link (``read``, see ``ServerLink.read_replies``): on a
    stream its waiter reads, nobody else would, and the send's reply settles
    this future."""

    read: Callable[[float | None], None] | None = None

    def result(self, timeout: float | None = None) -> Any:
        return super().result(self._read(timeout))

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return super().exception(self._read(timeout))

    def done(self) -> bool:
        self._read(0.0)
        return super().done()

    def _read(self, timeout: float | None) -> float | None:
        """Read until the send is answered, or ``timeout``; how long this
        future itself is still to be waited for."""
        if self.read is None or super().done():
            return timeout
        self.read(timeout)
        return 0.0


class Holding:
    """The held pushes of one rank (see module doc). ``send(server, msg)``
    sends a push and returns its future; ``loop`` runs the timer (None: no
    timer, the pushes wait for the rank's next call); ``hold_s``: default
    ``HOLD_S``; ``read(server, call, timeout)``: what waiting for a sent push
    does first (reads its server's replies, see ``ServerLink.read_replies``)."""

    def __init__(
        self,
        send: Callable[[int, Any], Any],
        loop: asyncio.AbstractEventLoop | None,
        hold_s: float | None = None,
        read: Callable[[int, Any, float | None], None] | None = None,
    ):
        self._send, self._loop, self._read = send, loop, read
        self.hold_s = HOLD_S if hold_s is None else hold_s
        # (server, message, its future, when held): the rank's thread appends and
        # releases; the loop's timer releases too.
        self._held: list[tuple[int, Any, concurrent.futures.Future, float]] = []
        self._lock = threading.Lock()
        self._armed = False
        self._last = 0.0

    def __bool__(self) -> bool:
        return bool(self._held)

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, server: int, msg: Any) -> concurrent.futures.Future:
        """Hold push ``msg`` for ``server``; its future settles when it has left."""
        done = _Held()
        with self._lock:
            now = time.monotonic()
            self._held.append((server, msg, done, now))
            self._last = now
            arm, self._armed = not self._armed, True
        if arm and self._loop is not None:
            self._loop.call_soon_threadsafe(self._tick)
        return done

    def release(self, carry: Collection[int] = ()) -> dict[int, list[Any]]:
        """The one exit: take every held push; return those for servers in
        ``carry`` (per server, in order, their futures done: the caller carries
        them in its own call), and send the others, in order."""
        with self._lock:
            held, self._held = self._held, []
        carried: dict[int, list[Any]] = {}
        for server, msg, done, _ in held:
            if server in carry:
                carried.setdefault(server, []).append(msg)
                done.set_result(None)
                continue
            try:
                call = self._send(server, msg)
            except Exception as exc:  # a call that cannot even be made (a lost server)
                done.set_exception(exc)
                continue
            call.add_done_callback(lambda call, done=done: _settle(call, done))
            if self._read is not None:
                done.read = functools.partial(self._read, server, call)
        return carried

    def _tick(self) -> None:
        """The timer, on the loop: release once the oldest push has waited
        ``hold_s``; while pushes keep coming, look again ``hold_s`` after the latest."""
        with self._lock:
            now = time.monotonic()
            since = self._held[0][3] if self._held else self._last
            due = now - since >= self.hold_s
            if not due:
                self._loop.call_later(since + self.hold_s - now, self._tick)
                return
            self._armed = False
        self.release()
