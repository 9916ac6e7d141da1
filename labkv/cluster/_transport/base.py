"""The one seam between a rank and its servers (and between servers), as interfaces.

A rank reaches server ``s`` through a :class:`ServerLink`: ``link.call(method,
*args)`` returns a waitable (``result(timeout)``, ``done()``,
``add_done_callback``), and :func:`wait_all` waits for several calls under one
deadline, turning a server known to be lost into an error that names it. A
server reaches its peers (votes on sliced keys, log entries) through a
:class:`Host`. The Dask implementations are in :mod:`.dask`, the in-process
ones of the tests in :mod:`labkv.cluster._runtime.inprocess`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from .._errors import TIMEOUTS, ClusterError
from .._protocol.messages import Peer, encode

# Client-side waits get this much longer than the servers' own, so that the
# server's error (which names the missing ranks) arrives before ours.
GRACE_S = 5.0
# How often a wait for a server looks whether the scheduler reported it lost.
POLL_S = 0.5
# Methods whose one argument is a message (see _wire) that may travel as one frame.
_MESSAGES = frozenset({"push", "pull"})


def _encoded(method: str, args: tuple) -> list:
    return [encode(a) if method in _MESSAGES and isinstance(a, tuple) else a for a in args]


class ServerLink:
    """How a rank reaches server ``sid`` on the Dask worker at ``address``."""

    #: whether arguments reach the server by reference (it copies what it keeps)
    same_process = False
    #: the event loop the link's calls run on, for timers (None: no loop of ours)
    loop: asyncio.AbstractEventLoop | None = None
    #: the server object itself, when calls reach it in-process (else None)
    server: Any = None

    def __init__(self, sid: int, address: str):
        self.sid, self.address = sid, address

    def call(self, method: str, *args: Any) -> Any:
        """Call ``method(*args)`` on the server: a future with ``result(timeout)``,
        ``done()`` and ``add_done_callback``; raises at once when the server is
        known to be lost."""
        raise NotImplementedError

    def lost(self) -> str | None:
        """Why the server is known to be lost (its worker gone), or None."""
        return None

    def lost_error(self, exc: BaseException) -> ClusterError:
        """The error a call to a lost server raises."""
        error = ClusterError(
            f"server {self.sid} on Dask worker {self.address} is lost "
            f"(its keys' values and optimizer states are gone): {exc}"
        )
        error._labkv_lost = True  # not an answer: a replicated link fails over
        return error

    def raise_if_lost(self) -> None:
        why = self.lost()
        if why is not None:
            raise self.lost_error(RuntimeError(why))


# -- waiting -----------------------------------------------------------------------------
def wait_all(
    calls: list[tuple[ServerLink, Any]],
    what: str,
    timeout: float,
    on_server_error: Callable[[BaseException], None] | None = None,
    on_tick: Callable[[], None] | None = None,
) -> list[Any]:
    """Results of in-flight calls ``(link, future)``, in order; every wait is
    bounded by ``timeout + GRACE_S`` in all. An error a server raised (its
    answer, see ``_server.answered``) goes to ``on_server_error`` first;
    ``on_tick()`` runs every ``POLL_S`` that a call is waited for.

    After a failed call the others are still waited for: a server must have
    answered this call before the next one asks it again (a failed update is
    reported once, to whichever call of the rank comes first)."""
    deadline = time.monotonic() + timeout + GRACE_S
    results, first_error = [], None
    for link, future in calls:
        try:
            results.append(
                _wait_one(link, future, deadline, what, timeout, on_server_error, on_tick)
            )
        except Exception as exc:
            first_error = first_error or exc
    if first_error is not None:
        raise first_error
    return results


def _wait_one(
    link: ServerLink,
    future: Any,
    deadline: float,
    what: str,
    timeout: float,
    on_server_error: Callable[[BaseException], None] | None,
    on_tick: Callable[[], None] | None = None,
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
            if hasattr(exc, "_labkv_server"):  # a server's own answer: raise it as it is
                raise
            link.raise_if_lost()
            if on_tick is not None:
                on_tick()
            if time.monotonic() >= deadline:
                error = ClusterError(
                    f"server {link.sid} on {link.address} did not answer {what} within "
                    f"{timeout + GRACE_S:g} s. The call was sent and may still take effect when "
                    "the server answers (a frozen or overloaded worker): this store waits for "
                    "that answer before its next call leaves, and takes the same push made "
                    "again at once as its retry (see docs/cluster.md, What a timeout means)"
                )
                error._labkv_timeout = True
                raise error from exc
        except Exception as exc:
            if hasattr(exc, "_labkv_server"):  # raised by the server: an updater's error
                if on_server_error is not None:
                    on_server_error(exc)
                raise
            if isinstance(exc, OSError) or "Actor was lost" in str(exc):
                link.raise_if_lost()  # a lost scheduler is named as the cause
                raise link.lost_error(exc) from exc
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
