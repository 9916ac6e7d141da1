"""What a long wait says while it lasts: starting the embedded cluster, a store's
servers, an upload, the init of many keys, saving or loading optimizer states.

A wait that ends within ``NOTICE_AFTER_S`` shows nothing; a longer one shows
``labkv: <what> ...`` once it has lasted that long, then the same line with how
long it took (:class:`~.line.Line`: in place in a notebook or a terminal, two
whole lines in a log). Only the process that made the call shows it: a call
made inside a rank (on a Dask worker) shows nothing. Dask config
``labkv.progress: false`` turns these notices off, with ``run``'s step line.

>>> shown = []
>>> with announced("starting 2 workers", after_s=0.0, show=shown.append):
...     pass
>>> shown[0], shown[1].startswith("labkv: starting 2 workers: done in ")
('labkv: starting 2 workers ...', True)
>>> with announced("a quick call", after_s=60.0, show=shown.append):
...     pass
>>> len(shown)
2
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from .line import Line

__all__ = ["NOTICE_AFTER_S", "announced", "progress_on"]

#: a wait shows its notice once it has lasted this long
NOTICE_AFTER_S = 2.0


def progress_on() -> bool:
    """Dask config ``labkv.progress`` (default True): whether the waits and
    ``run``'s steps are shown."""
    import dask

    return bool(dask.config.get("labkv.progress", True))


def _on_a_worker() -> bool:
    try:
        from distributed import get_worker

        get_worker()
    except (ImportError, ValueError):
        return False
    return True


@contextlib.contextmanager
def announced(
    what: str,
    after_s: float | None = None,
    show: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Say ``what`` is being waited for if the block lasts ``after_s`` seconds
    (default ``NOTICE_AFTER_S``), and how long it took once it ends (``failed
    after`` if it raised). ``show`` takes each text instead of the caller's
    notebook or stderr, and is shown to whatever the config says."""
    if after_s is None:
        after_s = NOTICE_AFTER_S
    if show is None and (not progress_on() or _on_a_worker()):
        yield
        return
    line = Line(show)
    lock = threading.Lock()
    start = time.monotonic()
    finished = [False]

    def notice() -> None:
        with lock:
            if not finished[0]:  # the timer may fire as the block ends
                line.write(f"labkv: {what} ...")

    timer = threading.Timer(after_s, notice)
    timer.daemon = True
    if after_s <= 0:
        notice()
    else:
        timer.start()
    ended = "failed after"
    try:
        yield
        ended = "done in"
    finally:
        timer.cancel()
        with lock:
            finished[0] = True
            if line.written:
                line.write(f"labkv: {what}: {ended} {time.monotonic() - start:.1f} s")
                line.end()
