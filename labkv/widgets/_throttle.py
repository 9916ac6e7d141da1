"""A daemon thread that calls a function at most ``hz`` times a second.

Live views must update while the user's next cell runs, so the refresh runs
on its own thread: a task on the kernel's asyncio loop would only run while a
cell awaits.

>>> import threading
>>> hits = threading.Event()
>>> ticker = Ticker(hits.set, hz=50)
>>> ticker.start()
>>> hits.wait(2)
True
>>> ticker.stop()
>>> ticker.running
False
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable

__all__ = ["Ticker"]


class Ticker:
    """Calls ``fn()`` every ``1/hz`` seconds on a daemon thread until stopped.

    An exception in ``fn`` is reported once as a warning and the ticker goes
    on, so one bad refresh does not freeze the dashboard.
    """

    def __init__(self, fn: Callable[[], object], hz: float = 10.0, name: str = "labkv-monitor"):
        if not hz > 0:
            raise ValueError(f"hz must be positive, got {hz!r}")
        self.fn = fn
        self.interval = 1.0 / hz
        self.name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False

    @property
    def running(self) -> bool:
        """Whether the thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread (no-op when running)."""
        if self.running:
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(self._stop,), name=self.name, daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the thread and wait up to ``timeout`` seconds for it (idempotent)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            try:
                self.fn()
            except Exception as exc:
                if not self._warned:
                    self._warned = True
                    warnings.warn(
                        f"labkv monitor refresh failed: {exc!r}", RuntimeWarning, stacklevel=1
                    )
