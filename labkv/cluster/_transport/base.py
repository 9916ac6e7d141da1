"""The one seam between a rank and its servers (and between servers), as interfaces.

A rank reaches server ``s`` through a :class:`ServerLink`: ``link.call(method,
*args)`` returns a :class:`Waitable`, and :func:`wait_all` waits for several
calls under one deadline, turning a server known to be lost into
:class:`~labkv.cluster._errors.ServerLost`. A caller uses a link's ``call``,
``notify``, ``lost`` and ``read_replies``, and three attributes: ``loop``, ``local`` and
``failover`` (:class:`Failover`: what it does about replicas; a plain link's,
:class:`SingleServer`, does nothing). A replicated link
(:class:`~labkv.cluster._rank.failover.ReplicatedLink`) is one more
implementation, and its own failover: it fails over inside its calls. A server reaches its
peers (votes on sliced keys, log entries) through a :class:`Host`. The Dask
implementations are in :mod:`.dask`, the in-process ones of the tests in
:mod:`labkv.cluster._runtime.inprocess`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

from .._errors import TIMEOUTS, CallTimedOut, ClusterError, ServerLost, answered_by
from .._protocol.messages import Peer, encode
from .._protocol.methods import method as _method

# Client-side waits get this much longer than the servers' own, so that the
# server's error (which names the missing ranks) arrives before ours.
GRACE_S = 5.0
# How often a wait for a server looks whether the scheduler reported it lost.
POLL_S = 0.5


def _encoded(method: str, args: tuple) -> list:
    """``args`` as they travel: a message argument encoded (see ``methods.Method.message``)."""
    if _method(method).message:
        return [encode(a) if isinstance(a, tuple) else a for a in args]
    return list(args)


class Waitable(Protocol):
    """What :meth:`ServerLink.call` returns (a ``concurrent.futures.Future`` is
    one). The calls of a link with a ``loop`` also have ``add_done_callback``
    and ``exception``, as a ``concurrent.futures.Future`` does: held pushes
    (:mod:`labkv.cluster._rank.holding`) settle through them."""

    def result(self, timeout: float | None = None) -> Any: ...

    def done(self) -> bool: ...


class Failover(Protocol):
    """What a link does about its server's replicas (:attr:`ServerLink.failover`):
    nothing, on a plain link (:class:`SingleServer`); a replicated link
    (:class:`~labkv.cluster._rank.failover.ReplicatedLink`) is its own."""

    #: how many times the link failed over to another replica
    generation: int

    def replicas(self) -> list[str]:
        """The workers holding the server, primary first."""
        ...

    def keep(self, seq: int, msg: Any) -> None:
        """Push ``msg``, the ``seq``-th of this rank to the server, was sent or
        is held: kept until a reply acknowledges it."""
        ...

    def track(self, method: str, future: Waitable) -> Waitable:
        """The waitable of a call made outside :meth:`ServerLink.call` (a held
        push, sent later or carried in a pull)."""
        ...

    def tend(self) -> None:
        """Called while another server's call is waited for: fail over now if
        the primary is known lost."""
        ...

    def bind(
        self,
        sender: str,
        timeout: float,
        on_failover: Callable[[Any, str | None], None] | None = None,
        on_promoted: Callable[[Any], None] | None = None,
        near: bool = False,
    ) -> None:
        """The calls of ``sender`` go through the link from now on, each wait
        bounded by ``timeout``; ``on_failover(link, old)``, ``on_promoted(link)``
        and ``near`` concern its replicas (see
        :meth:`labkv.cluster._rank.failover.ReplicatedLink.bind`)."""
        ...


class SingleServer:
    """The :class:`Failover` of a plain link: one replica, nothing to keep,
    track, tend or report."""

    generation = 0

    def __init__(self, address: str):
        self.address = address

    def replicas(self) -> list[str]:
        return [self.address]

    def keep(self, seq: int, msg: Any) -> None:
        pass

    def track(self, method: str, future: Waitable) -> Waitable:
        return future

    def tend(self) -> None:
        pass

    def bind(
        self,
        sender: str,
        timeout: float,
        on_failover: Callable[[Any, str | None], None] | None = None,
        on_promoted: Callable[[Any], None] | None = None,
        near: bool = False,
    ) -> None:
        pass


class ServerLink:
    """How a rank reaches server ``sid`` on the Dask worker at ``address``.

    A caller uses :meth:`call`, :meth:`notify`, :meth:`lost` and
    :meth:`read_replies`; three
    attributes say how the calls travel: :attr:`loop` (for timers),
    :attr:`local` (the server object, when arguments reach it by reference)
    and :attr:`failover` (its replicas: a plain link's do nothing)."""

    #: the event loop the link's calls run on, for timers (None: no loop of ours)
    loop: asyncio.AbstractEventLoop | None = None
    #: the server object when calls reach it in this process with their arguments
    #: by reference (it copies what it keeps), else None
    local: Any = None

    def __init__(self, sid: int, address: str):
        self.sid, self.address = sid, address
        self.failover: Failover = SingleServer(address)

    def call(self, method: str, *args: Any) -> Waitable:
        """Call ``method(*args)`` on the server; raises at once when the server
        is known to be lost."""
        raise NotImplementedError

    def notify(self, method: str, *args: Any) -> None:
        """:meth:`call` whose answer nobody reads (a backup's copy of a barrier
        arrival): a link on a stream sends it as a notice, which the server
        does not answer."""
        self.call(method, *args)

    def lost(self) -> str | None:
        """Why the server is known to be lost (its worker gone), or None."""
        return None

    def read_replies(self, call: Waitable, timeout: float | None) -> None:
        """Read the link's replies until ``call`` (one of its own) is answered,
        or ``timeout``: on a link whose caller reads them (a rank's own stream,
        see ``StreamLink.own_stream``); nothing where a loop reads them. For a
        future that settles from ``call``'s done-callback (a held push's)."""

    def _lost_error(self, exc: BaseException) -> ServerLost:
        """The error a call to a lost server raises."""
        return ServerLost(
            f"server {self.sid} on Dask worker {self.address} is lost "
            f"(its keys' values and optimizer states are gone): {exc}"
        )

    def _raise_if_lost(self) -> None:
        why = self.lost()
        if why is not None:
            raise self._lost_error(RuntimeError(why))


# -- waiting -----------------------------------------------------------------------------
def wait_all(
    calls: list[tuple[ServerLink, Waitable]],
    what: str,
    timeout: float,
    on_server_error: Callable[[BaseException], None] | None = None,
) -> list[Any]:
    """Results of in-flight calls ``(link, future)``, in order; every wait is
    bounded by ``timeout + GRACE_S`` in all, restarted for a call whose link
    failed over meanwhile (the call was made again). An error a server raised
    (its answer, see :func:`~labkv.cluster._errors.answered`) goes to
    ``on_server_error`` first. While one call is waited for, the other links
    of the wait are tended (:meth:`Failover.tend`) every ``POLL_S``.

    After a failed call the others are still waited for: a server must have
    answered this call before the next one asks it again (a failed update is
    reported once, to whichever call of the rank comes first)."""
    deadline = time.monotonic() + timeout + GRACE_S
    generations = [link.failover.generation for link, _ in calls]
    results, first_error = [], None
    for (link, future), generation in zip(calls, generations, strict=True):
        try:
            results.append(
                _wait_one(link, future, deadline, generation, what, timeout, on_server_error, calls)
            )
        except Exception as exc:
            first_error = first_error or exc
    if first_error is not None:
        raise first_error
    return results


def _wait_one(
    link: ServerLink,
    future: Waitable,
    deadline: float,
    generation: int,
    what: str,
    timeout: float,
    on_server_error: Callable[[BaseException], None] | None,
    calls: list[tuple[ServerLink, Waitable]],
) -> Any:
    """A call to a server whose worker died can sit in Dask's connect retries
    for up to its connect timeout, so the wait looks every ``POLL_S`` whether
    the scheduler has reported the server lost."""
    while True:
        try:
            return future.result(timeout=min(POLL_S, max(0.0, deadline - time.monotonic())))
        except ClusterError:
            raise
        except TIMEOUTS as exc:
            if answered_by(exc) is not None:  # a server's own answer: raise it as it is
                raise
            link._raise_if_lost()
            for other in {id(o): o for o, _ in calls if o is not link}.values():
                other.failover.tend()
            now = time.monotonic()
            if link.failover.generation != generation:  # failed over: the call was made again
                generation, deadline = link.failover.generation, now + timeout + GRACE_S
            if now >= deadline:
                raise CallTimedOut(
                    f"server {link.sid} on {link.address} did not answer {what} within "
                    f"{timeout + GRACE_S:g} s. The call was sent and may still take effect when "
                    "the server answers (a frozen or overloaded worker): this store waits for "
                    "that answer before its next call leaves, and takes the same push made "
                    "again at once as its retry (see docs/cluster.md, What a timeout means)"
                ) from exc
        except Exception as exc:
            if answered_by(exc) is not None:  # raised by the server: an updater's error
                if on_server_error is not None:
                    on_server_error(exc)
                raise
            if isinstance(exc, OSError):  # a broken connection
                link._raise_if_lost()  # a lost scheduler is named as the cause
                raise link._lost_error(exc) from exc
            raise


# -- what a server needs from its process ------------------------------------------------
class Host:
    """What a :class:`~labkv.cluster._server.actor.Server` needs from the process it runs in: its
    address, a way to publish event batches, and calls to its peers."""

    address = "in-process"

    def log_event(self, topic: str, batch: Any) -> None:
        """Publish a batch of events on ``topic``."""

    async def alive(self, address: str) -> bool:
        """Whether the scheduler still has the worker at ``address``."""
        return True

    def call_peer(self, peer: Peer, method: str, args: list) -> Any:
        """An awaitable of ``method(*args)`` on the server ``peer`` (its
        ``(address, actor_key)``), called from the server's loop. A
        ``replicate`` call's entry always reaches the peer as its own copy
        (a backup keeps the arrays it applies)."""
        raise NotImplementedError
