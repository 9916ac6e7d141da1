"""The errors of the cluster code, shared by ranks, servers and the transport.

Two kinds of error cross the seam between a rank and its servers:

- the cluster's own, as types: :class:`ServerLost` (a server's worker is gone,
  or the connection to it broke), :class:`CallTimedOut` (a wait ran past its
  deadline), :class:`Deposed` (a backup refuses its old primary's entries);
- a server's *answer*: any exception a server method raised (an updater's
  ``ValueError`` keeps its type: users catch it), tagged as the answer of
  server ``sid`` (:func:`mark_answer`, read with :func:`answered_by`), and, when
  it is a failed update of this rank's pushes, which pushes
  (:func:`mark_failed_update`, read with :func:`failed_update`).

This module is the one reader and writer of those tags: they travel inside the
exception (Dask pickles an exception's ``__dict__``), so they are attributes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import functools
import pickle
from collections.abc import Callable
from typing import Any, NamedTuple

import cloudpickle

_ANSWER = "_labkv_server"  # the tags (see module doc)
_UPDATE = "_labkv_update"


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (Python 3.11+), or the same ``__notes__`` list before."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10: kept in the attribute 3.11's traceback prints
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]


def portable(exc: BaseException) -> BaseException:
    """``exc`` when it survives pickling as Dask pickles (cloudpickle: classes
    of ``__main__`` travel by value), else a ``RuntimeError`` with the same text."""
    try:
        pickle.loads(cloudpickle.dumps(exc))
    except Exception:
        plain = RuntimeError(f"{type(exc).__name__}: {exc}")
        plain.__notes__ = list(getattr(exc, "__notes__", []))
        return plain
    return exc


class ClusterError(RuntimeError):
    """A cross-process wait failed: a timeout (naming what is missing), an
    aborted run, or an updater that raised on a server."""


class ServerLost(ClusterError):
    """A server is lost: its worker is gone or the connection to it broke
    (never an answer the server gave). A replicated link fails over on it."""


class CallTimedOut(ClusterError):
    """A server did not answer within the wait's deadline. The call was sent
    and may still take effect (see ``docs/cluster.md``, What a timeout means)."""


class Deposed(ClusterError):
    """A backup's answer to an entry from a primary it has replaced: that
    primary is deposed (see the server's replication log)."""


def deposed(message: str) -> Deposed:
    """The :class:`Deposed` error a backup answers with."""
    return Deposed(message)


def is_deposed(error: BaseException | None) -> bool:
    """Whether ``error`` (any outcome, an exception or not) deposes its primary."""
    return isinstance(error, Deposed)


#: What a timed-out wait raises: one class from Python 3.11 on, three before.
TIMEOUTS = (TimeoutError, concurrent.futures.TimeoutError, asyncio.TimeoutError)


def mark_answer(exc: BaseException, sid: int) -> BaseException:
    """Tag ``exc`` as server ``sid``'s own answer; ``exc``."""
    setattr(exc, _ANSWER, sid)
    return exc


def answered_by(exc: BaseException) -> int | None:
    """The server whose answer ``exc`` is (see :func:`mark_answer`), or None."""
    return vars(exc).get(_ANSWER)


def answered(method: Callable) -> Callable:
    """Mark every exception a server method raises as the server's answer (an
    updater's error, a timeout it names), so that a rank never takes it for a
    lost connection (see :func:`labkv.cluster._transport.base.wait_all`)."""

    @functools.wraps(method)
    async def answer(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await method(self, *args, **kwargs)
        except Exception as exc:
            mark_answer(exc, self.sid)
            raise

    return answer


class UpdateFailure(NamedTuple):
    """Which of a sender's pushes a failed update held: on ``server``, per key
    the sequence number of the push that carried it."""

    server: int
    seqs: dict


def mark_failed_update(exc: BaseException, server: int, seqs: dict) -> BaseException:
    """Tag ``exc`` (an updater's error, reported to one sender) with the pushes
    of that sender it failed; ``exc``."""
    setattr(exc, _UPDATE, {"server": server, "seqs": dict(seqs)})
    return exc


def failed_update(exc: BaseException) -> UpdateFailure | None:
    """The pushes a failed update held (see :func:`mark_failed_update`), or
    None when ``exc`` is no failed update."""
    tag = vars(exc).get(_UPDATE)
    return None if tag is None else UpdateFailure(tag["server"], tag["seqs"])


def is_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says its server may be gone, not an answer it gave: a
    :class:`ServerLost`, or a broken connection (``OSError``)."""
    return isinstance(exc, (ServerLost, OSError)) and answered_by(exc) is None


class Failure:
    """A failed update on one server: the updater's own exception (with a
    note naming the server, keys and rounds), owed once to each sender whose
    pushes the update held (``senders``: sender -> {key: sequence number of
    the push that carried it})."""

    __slots__ = ("error", "server", "keys", "untold")

    def __init__(
        self, error: BaseException, server: int, keys: list[Any], senders: dict[str, dict]
    ):
        self.error, self.server, self.keys = error, server, list(keys)
        self.untold = {sender: dict(seqs) for sender, seqs in senders.items()}

    def report_to(self, sender: str) -> BaseException | None:
        """The exception for ``sender`` the first time it asks; None after that
        (or when none of its pushes was in the failed update). It carries which
        of the sender's pushes failed (:func:`mark_failed_update`), so the sender can
        restore what it committed for them (compression residuals)."""
        seqs = self.untold.pop(sender, None)
        if seqs is None:
            return None
        return mark_failed_update(copy.copy(self.error), self.server, seqs)
