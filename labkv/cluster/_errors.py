"""The errors of the cluster code, shared by ranks, servers and the transport."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable
from typing import Any


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
