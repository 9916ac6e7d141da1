"""The errors of the cluster code, shared by ranks, servers and the transport."""

from __future__ import annotations

import asyncio
import concurrent.futures


class ClusterError(RuntimeError):
    """A cross-process wait failed: a timeout (naming what is missing), an
    aborted run, or an updater that raised on a server."""


#: What a timed-out wait raises: one class from Python 3.11 on, three before.
TIMEOUTS = (TimeoutError, concurrent.futures.TimeoutError, asyncio.TimeoutError)
