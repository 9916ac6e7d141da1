"""The errors of the cluster code, shared by ranks, servers and the transport."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import pickle
from collections.abc import Callable
from typing import Any

import cloudpickle


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


def deposed(message: str) -> ClusterError:
    """What a backup answers an entry from a primary it has replaced: that
    primary is deposed (see ``Replication._forward``)."""
    error = ClusterError(message)
    error._labkv_deposed = True
    return error


def is_deposed(error: BaseException | None) -> bool:
    return getattr(error, "_labkv_deposed", False)


#: What a timed-out wait raises: one class from Python 3.11 on, three before.
TIMEOUTS = (TimeoutError, concurrent.futures.TimeoutError, asyncio.TimeoutError)


def answered(method: Callable) -> Callable:
    """Mark every exception a server method raises as the server's answer (an
    updater's error, a timeout it names), so that a rank never takes it for a
    lost connection (see ``_transport.wait_all``)."""

    @functools.wraps(method)
    async def answer(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await method(self, *args, **kwargs)
        except Exception as exc:
            exc._labkv_server = self.sid
            raise

    return answer
