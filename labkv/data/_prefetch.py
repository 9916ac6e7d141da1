"""Run an iterator in a background thread, a bounded number of items ahead."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["Prefetcher"]

T = TypeVar("T")

_DONE = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetcher(Generic[T]):
    """Iterate ``make()`` in a daemon thread, at most ``depth`` items ahead.

    An exception raised by the iterator is raised again in the consumer, after
    the items produced before it. ``close()`` (or leaving a ``with`` block)
    stops the thread and waits for it.

    >>> with Prefetcher(lambda: iter(range(3)), depth=2) as p:
    ...     list(p)
    [0, 1, 2]
    """

    def __init__(self, make: Callable[[], Iterator[T]], depth: int = 2) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(
            target=self._run,
            args=(make, self._queue, self._stop),
            name="labkv-prefetch",
            daemon=True,
        )
        self._thread.start()

    @staticmethod
    def _run(make: Callable[[], Iterator[T]], out: queue.Queue, stop: threading.Event) -> None:
        # A static method: the thread must not keep the Prefetcher alive, so that
        # dropping an unfinished one lets __del__ stop the thread.
        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    out.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        it = None
        try:
            it = make()
            for item in it:
                if not put(item):
                    return
            put(_DONE)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            put(_Failure(e))
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    def __iter__(self) -> Prefetcher[T]:
        return self

    def __next__(self) -> T:
        if self._finished:
            raise StopIteration
        while True:
            try:
                item = self._queue.get(timeout=0.1)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self._finished = True
                    raise StopIteration from None
        if item is _DONE:
            self._finished = True
            self._thread.join()
            raise StopIteration
        if isinstance(item, _Failure):
            self._finished = True
            self._thread.join()
            raise item.error
        return item

    def close(self) -> None:
        """Stop the thread and drop what it had read ahead."""
        self._finished = True
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join()

    @property
    def alive(self) -> bool:
        """Whether the background thread is still running."""
        return self._thread.is_alive()

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
