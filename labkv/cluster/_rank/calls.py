"""A rank's calls to its servers: ordering, held pushes, pushes in flight.

Choices made here, and why:

- **Pushes below ``ACK_ABOVE`` bytes are not waited for.** The arrays are
  copied (cheap at that size, and the caller may reuse its buffer at once)
  and the push is in flight when ``push`` returns; the next pull carries the
  number of pushes sent to that server, and the server waits for them, so a
  rank still reads its own writes. A push's error (a lost server, an updater
  that raised) surfaces at the rank's next call (:meth:`Calls.reap`) or
  :meth:`Calls.flush`. Big pushes are sent without a copy and waited for: a
  copy would cost more than the reply's latency.
- **Small pushes are held** (:mod:`labkv.cluster._rank.holding`) when the link runs on an event
  loop: a push to a server in this process, or one that travels as one frame;
  every other call sends what is held first, and a pull carries it.
- **Calls leave whole, and an interrupted one finishes before the next
  leaves** (:meth:`Calls.sending`): a Ctrl-C while sequence numbers are taken
  and messages handed over waits until they are sent; every wait stays
  interruptible, and the calls an interrupted wait leaves behind are waited
  for (their errors raised) before this rank sends anything else, so that no
  later call overtakes them (a push must not reach a server before the
  optimizer an interrupted ``set_optimizer`` sent there).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from ..._call.interrupts import sigint_held
from .._errors import CallTimedOut, ClusterError
from .._protocol.messages import Pull, Push, encode
from .._protocol.packing import sealable
from .._transport.base import ServerLink, wait_all
from .holding import Holding
from .split import kept_copy

#: Pushes of at least this many bytes (all servers together) are waited for.
ACK_ABOVE = 1 << 20


class _Sending:
    """The context manager of :meth:`Calls.sending` (a class: every push and pull
    enters one, and a generator-based one cost twice as much)."""

    __slots__ = ("calls", "what")

    def __init__(self, calls: Calls, what: str):
        self.calls, self.what = calls, what

    def __enter__(self) -> None:
        if self.calls.closed is not None:  # a held push would not reach send()
            raise ClusterError(self.calls.closed)
        self.calls.settle()
        sigint_held.__enter__()

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: Any) -> None:
        if kind is not None and not issubclass(kind, Exception):
            self.calls.closed = (
                f"this store is closed: {kind.__name__} interrupted a {self.what} while it "
                "was being sent, which may have left this rank's pushes out of order; make "
                "a new store (and load its values and states from a checkpoint)"
            )
        sigint_held.__exit__(kind, exc, tb)  # delivers a held SIGINT, after the close


class Calls:
    """The calls of one rank (``sender``, a fresh id per store instance, after
    ``sender_prefix``: a run's ranks carry the run's, see ``Server.barred``) to its
    servers through ``links``; every wait is bounded by ``timeout`` (plus a
    grace, see :func:`labkv.cluster._transport.base.wait_all`); ``on_server_error`` sees each
    error a server raised before it is raised here."""

    def __init__(
        self,
        links: list[ServerLink],
        timeout: float,
        on_server_error: Callable[[BaseException], None] | None = None,
        sender_prefix: str = "",
    ):
        self.links, self.timeout, self.on_server_error = links, timeout, on_server_error
        self.sender = sender_prefix + uuid.uuid4().hex
        self.sent = [0] * len(links)  # pushes sent to each server
        self.inflight: list[tuple[int, Any]] = []
        loop = links[0].loop if links else None
        self.holding = None if loop is None else Holding(self._send_push, loop, read=self._read)
        self.closed: str | None = None  # why no call may be made any more
        self.interrupted: list[tuple[int, Any]] = []  # calls whose wait was interrupted

    def sending(self, what: str) -> _Sending:
        """A block that takes sequence numbers or hands pushes over: a SIGINT
        is held until it ends (see :mod:`labkv._call.interrupts`); anything else that is
        not an ``Exception`` escaping it closes the calls, since a number may
        have been taken and not sent."""
        return _Sending(self, what)

    def settle(self) -> None:
        """Wait for the calls an interrupted or timed-out wait left (raising
        their errors): before anything else leaves (see module doc)."""
        if self.interrupted:
            interrupted, self.interrupted = self.interrupted, []
            self.wait(interrupted, "a call that was not answered before")

    def call(self, s: int, method: str, *args: Any) -> Any:
        """Call ``method(*args)`` on server ``s`` after sending the held pushes,
        so that every call sees this rank's earlier pushes; a future."""
        with self.sending(method):
            if self.holding:
                self.holding.release()
            return self.send(s, method, *args)

    def send(self, s: int, method: str, *args: Any) -> Any:
        """:meth:`call` without sending the held pushes first."""
        if self.closed is not None:
            raise ClusterError(self.closed)
        return self.links[s].call(method, *args)

    def _send_push(self, s: int, msg: Any) -> Any:
        return self.send(s, "push", msg)

    def _read(self, s: int, call: Any, timeout: float | None) -> None:
        self.links[s].read_replies(call, timeout)

    def wait(self, calls: list[tuple[int, Any]], what: str) -> list[Any]:
        """Results of in-flight calls ``(server, future)``, in order (a
        replicated link fails over inside its calls); when the wait is
        interrupted (not by an ``Exception``) or times out, the calls not
        answered are waited for before the next call leaves (see module doc):
        they were sent, and may still take effect."""
        links = self.links
        try:
            return wait_all(
                [(links[s], f) for s, f in calls], what, self.timeout, self.on_server_error
            )
        except CallTimedOut:  # unanswered: may still take effect
            self.interrupted.extend((s, f) for s, f in calls if not f.done())
            raise
        except Exception:
            raise
        except BaseException:  # an interrupt: every call may still take effect
            self.interrupted.extend(calls)
            raise

    def call_each(self, method: str, args: dict[int, tuple]) -> list[tuple[int, Any]]:
        """``method(*args[s])`` on each server ``s`` of ``args``; ``(server,
        future)`` each. The calls leave whole: every server gets its own, Ctrl-C or not."""
        with self.sending(method):
            return [(s, self.call(s, method, *a)) for s, a in args.items()]

    def all(self, method: str, *args: Any) -> list[Any]:
        """``method(*args)`` on every server; their results by server id."""
        calls = self.call_each(method, dict.fromkeys(range(len(self.links)), args))
        return self.wait(calls, method)

    def next_seq(self, s: int) -> int:
        """The sequence number of this rank's next push to server ``s`` (counted as sent)."""
        seq = self.sent[s]
        self.sent[s] += 1
        return seq

    def push(self, messages: list[tuple[int, Push]], wait: bool, keep_copies: bool = False) -> None:
        """:meth:`send_pushes`, then :meth:`finish_pushes`."""
        with self.sending("push"):
            calls = self.send_pushes(messages, wait, keep_copies)
        self.finish_pushes(calls, wait)

    def send_pushes(
        self, messages: list[tuple[int, Push]], wait: bool, keep_copies: bool = False
    ) -> list[tuple[int, Any]]:
        """Send one push message per server (call it inside :meth:`sending`, with
        the numbers' taking); the calls to give :meth:`finish_pushes`.
        Not waited for: held when that helps (see module doc), else in flight.
        Each push is given to its link to keep (a replicated one keeps it until
        acknowledged); with ``keep_copies``, a waited-for push (it lends the
        caller's arrays) is kept as a copy, made while it travels (the caller
        cannot change its arrays before ``push`` returns). Not towards a
        primary in this process: if that one is lost, so is this rank."""
        links = self.links
        calls, hold, lent = [], [], []
        for s, msg in messages:
            if wait and keep_copies and links[s].local is None:
                lent.append((s, msg))
            else:
                links[s].failover.keep(msg.header.seq, msg)
        for s, msg in messages:
            # Held: a copied push to a server in this process, or one that travels
            # as one frame (folded into a pull, it keeps that pull one pickled frame).
            if not wait and self.holding is not None:
                if links[s].local is not None:
                    hold.append((s, msg))
                    continue
                if sealable(msg):
                    hold.append((s, encode(msg)))
                    continue
            calls.append((s, self.call(s, "push", msg)))
        for s, msg in hold:  # after the calls above: call() sends what was held first
            self.inflight.append((s, links[s].failover.track("push", self.holding.hold(s, msg))))
        for s, msg in lent:
            links[s].failover.keep(msg.header.seq, kept_copy(msg))
        return calls

    def finish_pushes(self, calls: list[tuple[int, Any]], wait: bool) -> None:
        """``wait``: wait until the pushes ``calls`` have been applied; else keep
        them in flight."""
        if not wait:
            self.inflight.extend(calls)
            return
        self.flush()
        self.wait(calls, "push")

    def pull(
        self,
        keys: dict[int, list],
        rank: int | None = None,
        step: int | None = None,
        rows: dict[int, dict] | None = None,
    ) -> list[Any]:
        """Pull ``keys[s]`` from each server ``s``: each pull carries the pushes
        held for its server (the others are sent now), and waits, on the server,
        for this rank's earlier pushes (``step``: rank ``rank``'s step, see
        :mod:`.steps`; ``rows[s]``: the rows of its keys to read alone, see
        :mod:`labkv.cluster._rows`). The replies, in the order of ``keys``."""
        with self.sending("pull"):  # the held pushes ride in the pulls: all of them leave
            carried = self.holding.release(carry=keys) if self.holding else {}
            sent, rows = self.sent, rows or {}
            calls = [
                (s, self.send(s, "pull", Pull(self.sender, sent[s], ks, rank, step, r, held)))
                for s, ks in keys.items()
                for held, r in [(tuple(carried.get(s, ())), rows.get(s))]
            ]
        self.flush()  # waits concurrently with the pulls: both are already sent
        return self.wait(calls, "pull")

    def flush(self) -> None:
        """Wait for the pushes still in flight (raising their errors)."""
        if self.holding:
            with self.sending("push"):
                self.holding.release()
        inflight, self.inflight = self.inflight, []
        self.wait(inflight, "a push")

    def reap(self) -> None:
        """Raise the error of a finished in-flight push, if any; keep the rest."""
        if any(f.done() for _, f in self.inflight):
            done = [(s, f) for s, f in self.inflight if f.done()]
            self.inflight = [(s, f) for s, f in self.inflight if not f.done()]
            self.wait(done, "a push")
