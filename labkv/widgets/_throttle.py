"""A daemon thread that calls a function at most ``hz`` times a second.

Live views must update while the user's next cell runs, so the refresh runs
on its own thread: a task on the kernel's asyncio loop would only run while a
cell awaits. That thread holds the GIL while it works, so its CPU time is
taken from the user's code: when calls get costly (a busy store changes every
table at every tick), the ticker spaces them so that they use at most
``cpu_share`` of a core, but never less often than ``min_hz``.

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
import time
import warnings
from collections.abc import Callable

__all__ = ["Ticker"]


class Ticker:
    """Calls ``fn()`` on a daemon thread until stopped, waiting ``1/hz`` seconds
    after each call, or longer after a costly one (see module doc).

    An exception in ``fn`` is reported once as a warning and the ticker goes
    on, so one bad refresh does not freeze the dashboard.
    """

    def __init__(
        self,
        fn: Callable[[], object],
        hz: float = 10.0,
        name: str = "labkv-monitor",
        cpu_share: float = 0.005,
        min_hz: float = 1.0,
    ):
        if not hz > 0 or not min_hz > 0:
            raise ValueError(f"hz and min_hz must be positive, got {hz!r} and {min_hz!r}")
        if not 0 < cpu_share <= 1:
            raise ValueError(f"refresh_cpu (cpu_share) must be in (0, 1], got {cpu_share!r}")
        self.fn = fn
        self.interval = 1.0 / hz
        self.longest = max(self.interval, 1.0 / min_hz)
        self.cpu_share = cpu_share
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

    def wait_after(self, cpu_s: float) -> float:
        """Seconds to wait after a call that took ``cpu_s`` of this thread's CPU.

        >>> ticker = Ticker(print, hz=10, cpu_share=0.005, min_hz=1)
        >>> ticker.wait_after(0.0001), ticker.wait_after(0.0008), ticker.wait_after(0.5)
        (0.1, 0.16, 1.0)
        """
        return min(max(self.interval, cpu_s / self.cpu_share), self.longest)

    def _run(self, stop: threading.Event) -> None:
        wait = self.interval
        while not stop.wait(wait):
            start = time.thread_time()
            try:
                self.fn()
            except Exception as exc:
                if not self._warned:
                    self._warned = True
                    warnings.warn(
                        f"labkv monitor refresh failed: {exc!r}", RuntimeWarning, stacklevel=1
                    )
            wait = self.wait_after(time.thread_time() - start)
