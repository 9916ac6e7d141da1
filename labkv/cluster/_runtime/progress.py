"""Progress of ``run``: the ranks' step loops (``for step in kv.steps(n)``) as
one line that says where the run is, updated while the caller waits.

Each rank reports its step at most twice a second, and at the end of each loop
(:func:`step_reporter`, a hook of its :class:`~labkv.cluster._rank.steps.StepCounter`),
with ``Worker.log_event`` on the run's own topic; the caller hears it through
``Client.subscribe_topic`` and shows the slowest rank's step, which is where the
run is: a line on stderr in a terminal (``\\r``, then a newline at the end), an
HTML line updated in place in a notebook (one ``display`` updated by its id), and
on a stderr that is no terminal (a log file, CI) a whole line at most every
``LOG_EVERY_S`` seconds and at the end, so a log has no carriage returns.
A function without a step loop reports nothing and shows nothing.

>>> lines = []
>>> p = Progress(None, "t", ranks=2, show=lines.append)
>>> p.heard((0.0, [0, 4, 10])); p.heard((0.0, [1, 3, 10])); p.draw()
>>> lines[-1]
'run: step 3 of 10, 2 ranks (slowest rank 1)'
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from .._transport.scheduler import forget_topic
from .line import Line

__all__ = ["EVERY_S", "LOG_EVERY_S", "Progress", "progress_topic", "step_reporter"]

#: a rank reports its step at most this often (and at each loop's end)
EVERY_S = 0.5
#: on a stderr that is no terminal, a line at most this often (and at the end)
LOG_EVERY_S = 10.0


def progress_topic(group: str) -> str:
    """The topic of a run's progress (``group``: the run's barrier group)."""
    return f"labkv-progress-{group}"


def step_reporter(rank: int, topic: str, counter: Any) -> Callable[[int, bool], None]:
    """The step hook of a rank that sends ``[rank, step, steps]`` (``steps`` the
    number its loops reach) on ``topic``."""
    from distributed import get_worker

    worker = get_worker()
    last = [0.0]

    def report(number: int, _resumed: bool) -> None:
        now = time.monotonic()
        total = counter.total
        if number >= total or now - last[0] >= EVERY_S:
            last[0] = now
            worker.log_event(topic, [rank, number, total])

    return report


class Progress:
    """The caller's side: hears the ranks' steps on ``topic`` and shows where the
    run is (``show(line)``; by default stderr or the notebook)."""

    def __init__(
        self,
        client: Any,
        topic: str,
        ranks: int,
        show: Callable[[str], None] | None = None,
    ):
        self.client, self.topic, self.ranks = client, topic, ranks
        self.at: dict[int, tuple[int, int]] = {}
        self._lock = threading.Lock()
        self._drawn = 0.0
        self._text = ""
        self._line = Line(show)
        self._logged = -LOG_EVERY_S

    def start(self) -> Progress:
        self.client.subscribe_topic(self.topic, self.heard)
        return self

    def heard(self, event: tuple[float, Any]) -> None:
        """A rank's report (the ``subscribe_topic`` handler)."""
        rank, number, total = event[1]
        with self._lock:
            self.at[int(rank)] = (int(number), int(total))
        if time.monotonic() - self._drawn >= EVERY_S:
            self.draw()

    def line(self) -> str:
        with self._lock:
            at = dict(self.at)
        if not at:
            return ""
        slowest = min(at, key=lambda r: (at[r][0], r))
        number, total = at[slowest]
        who = f", {self.ranks} ranks (slowest rank {slowest})" if self.ranks > 1 else ""
        return f"run: step {number} of {total}{who}"

    def draw(self, last: bool = False) -> None:
        self._drawn = time.monotonic()
        text = self.line()
        if text and text != self._text:
            if self._line.logs and not last:
                if self._drawn - self._logged < LOG_EVERY_S:
                    return
                self._logged = self._drawn
            self._text = text
            self._line.write(text)

    def close(self) -> None:
        """Stop hearing; the last line shown stays (a terminal's ends with a newline)."""
        with contextlib.suppress(Exception):  # the scheduler may be gone: run raises
            self.client.unsubscribe_topic(self.topic)
            # the scheduler keeps every topic's last events: drop the run's
            self.client.run_on_scheduler(forget_topic, self.topic)
        self.draw(last=True)
        self._line.end()
