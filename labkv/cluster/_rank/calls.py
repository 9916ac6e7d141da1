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

import contextlib
import functools
import uuid
from collections.abc import Callable
from typing import Any

from ..._interrupts import sigint_held
from .._errors import ClusterError
from .._protocol.messages import Pull, Push, encode
from .._protocol.packing import sealable
from .._transport.base import ServerLink, wait_all
from .failover import is_lost, kept_copy
from .holding import Holding

#: Pushes of at least this many bytes (all servers together) are waited for.
ACK_ABOVE = 1 << 20


class _Sending:
    """The context manager of :meth:`Calls.sending` (a class: every push and pull
    enters one, and a generator-based one cost twice as much)."""

    __slots__ = ("calls", "what")

    def __init__(self, calls: Calls, what: str):
        self.calls, self.what = calls, what

    def __enter__(self) -> None:
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
        self.holding = None if loop is None else Holding(self._send_push, loop)
        self.closed: str | None = None  # why no call may be made any more
        # Replicated servers (see _replicas): pushes are kept until acknowledged,
        # and a call that finds its primary lost fails over and is made again.
        self.replicated = any(getattr(link, "replicated", False) for link in links)
        self.told: set[tuple] = set()  # the failed updates raised here (see _told_before)
        self.interrupted: list[tuple[int, Any]] = []  # calls whose wait was interrupted

    def sending(self, what: str) -> _Sending:
        """A block that takes sequence numbers or hands pushes over: a SIGINT
        is held until it ends (see :mod:`labkv._interrupts`); anything else that is
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

    def wait(self, calls: list[tuple[int, Any]], what: str) -> list[Any]:
        """Results of in-flight calls ``(server, future)``, in order; when the
        wait is interrupted (not by an ``Exception``) or times out, the calls
        not answered are waited for before the next call leaves (see module
        doc): they were sent, and may still take effect."""
        try:
            if self.replicated:
                return self._wait_replicated(calls, what)
            links = self.links
            return wait_all(
                [(links[s], f) for s, f in calls], what, self.timeout, self.on_server_error
            )
        except Exception as exc:
            if getattr(exc, "_labkv_timeout", False):  # unanswered: may still take effect
                self.interrupted.extend((s, f) for s, f in calls if not f.done())
            raise
        except BaseException:
            self.interrupted.extend(calls)
            raise

    def _wait_replicated(self, calls: list[tuple[int, Any]], what: str) -> list[Any]:
        """:meth:`wait` with failover: a call whose primary is lost waits for the
        failover (the kept pushes replayed), then is made again on the new
        primary (a push not: the replay carried it). A failed update this rank
        was already told of is not raised again: the call is made again."""
        results, first_error = [], None
        for s, future in calls:
            link = self.links[s]
            while True:
                stale = getattr(future, "generation", link.generation) != link.generation
                if stale and not future.done():
                    # Made on a primary replaced since: its wait would watch the new
                    # primary, alive, while the call sits on the dead one's connection.
                    future = self._again(link, future)
                    if future is None:  # a push: the failover's replay carried it
                        results.append(None)
                        break
                    continue
                try:
                    others = [(o, f) for o, f in calls if o != s]
                    tick = functools.partial(self._fail_over_lost, others) if others else None
                    waited = wait_all([(link, future)], what, self.timeout, on_tick=tick)
                    results.append(waited[0])
                    break
                except Exception as exc:
                    if self._told_before(exc):
                        future = self._again(link, future)
                        if future is None:
                            results.append(None)
                            break
                        continue
                    if hasattr(exc, "_labkv_server") and self.on_server_error is not None:
                        self.on_server_error(exc)
                    if not (is_lost(exc) and getattr(link, "replicated", False)):
                        first_error = first_error or exc
                        results.append(None)
                        break
                generation = getattr(future, "generation", link.generation)
                try:
                    link.fail_over(self.sender, self.sent[s], generation, self.timeout)
                except Exception as exc:
                    first_error = first_error or exc
                    results.append(None)
                    break
                future = self._again(link, future)
                if future is None:
                    results.append(None)
                    break
        for link in self.links:
            if getattr(link, "stale", False):
                with contextlib.suppress(Exception):  # a lost primary: the next call fails over
                    link.refresh(self.timeout)
            if (
                getattr(link, "replicated", False) and link.short()
            ):  # no worker was free to seed a replica on: look again
                link.on_failover(link.sid, None, link.addresses())
        if first_error is not None:
            raise first_error
        return results

    def _fail_over_lost(self, calls: list[tuple[int, Any]]) -> None:
        """While one call of a wait is waited for, fail over the other servers
        of the wait whose primary is known lost: the call waited for may need
        them (the slices of a key vote on each update), and their calls are
        made again when the wait reaches them."""
        for s, future in calls:
            link = self.links[s]
            if getattr(link, "replicated", False) and link.lost() is not None:
                generation = getattr(future, "generation", link.generation)
                with contextlib.suppress(Exception):  # raised again when s is waited for
                    link.fail_over(self.sender, self.sent[s], generation, self.timeout)

    def _told_before(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a failed update this rank has raised already (a
        primary that told it, then died before the backups learned so, is
        followed by one that tells it again); notes it as told if not."""
        update = getattr(exc, "_labkv_update", None)
        if update is None:
            return False
        told = (update["server"], tuple(sorted(update["seqs"].items(), key=repr)))
        if told in self.told:
            return True
        self.told.add(told)
        return False

    @staticmethod
    def _again(link: ServerLink, future: Any) -> Any:
        """The call of ``future`` made again after a failover (None for a push)."""
        method, args = getattr(future, "method", "push"), getattr(future, "args", ())
        if method == "push":
            return None
        if method == "pull":  # the pushes it carried were replayed with the others
            args = (args[0]._replace(pushes=()),)
        return link.call(method, *args)

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
        Replicated servers: each push is kept until acknowledged; with
        ``keep_copies``, a waited-for push (it lends the caller's arrays) is kept
        as a copy, made while it travels (the caller cannot change its arrays
        before ``push`` returns). Not towards a primary in this process: if that
        one is lost, so is this rank."""
        calls, hold, lent = [], [], []
        if self.replicated:
            for s, msg in messages:
                if wait and keep_copies and not self.links[s].same_process:
                    lent.append((s, msg))
                else:
                    self.links[s].keep(msg.header.seq, msg)
        for s, msg in messages:
            # Held: a copied push to a server in this process, or one that travels
            # as one frame (folded into a pull, it keeps that pull one pickled frame).
            if not wait and self.holding is not None:
                if self.links[s].same_process:
                    hold.append((s, msg))
                    continue
                if sealable(msg):
                    hold.append((s, encode(msg)))
                    continue
            calls.append((s, self.call(s, "push", msg)))
        for s, msg in hold:  # after the calls above: call() sends what was held first
            held = self.holding.hold(s, msg)
            if self.replicated:
                held.generation = self.links[s].generation
            self.inflight.append((s, held))
        for s, msg in lent:
            self.links[s].keep(msg.header.seq, kept_copy(msg))
        return calls

    def finish_pushes(self, calls: list[tuple[int, Any]], wait: bool) -> None:
        """``wait``: wait until the pushes ``calls`` have been applied; else keep
        them in flight."""
        if not wait:
            self.inflight.extend(calls)
            return
        self.flush()
        self.wait(calls, "push")

    def pull(self, keys: dict[int, list]) -> list[Any]:
        """Pull ``keys[s]`` from each server ``s``: each pull carries the pushes
        held for its server (the others are sent now), and waits, on the server,
        for this rank's earlier pushes. The replies, in the order of ``keys``."""
        with self.sending("pull"):  # the held pushes ride in the pulls: all of them leave
            carried = self.holding.release(carry=keys) if self.holding else {}
            sent = self.sent
            calls = [
                (s, self.send(s, "pull", Pull(self.sender, sent[s], ks, tuple(carried.get(s, ())))))
                for s, ks in keys.items()
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
