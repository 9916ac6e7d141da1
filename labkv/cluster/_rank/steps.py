"""A rank's step loop, ``for step in kv.steps(n)``: what a replacement needs
to take a lost rank's place mid-run (``run(..., on_rank_loss="replace")``).

Each step's pushes and pulls carry the step's number, counted over every step
loop of the rank's function (a second loop goes on from the first's last
step), so that the servers know which (key, rank, step) they have seen
(:mod:`labkv.cluster._server.replication.step_marks`); pulls after a loop carry the
number of the step after it (they read what every step made), pushes outside
a loop carry none (they are not replayed). ``step.rng`` is a fresh
numpy Generator seeded by ``(seed, rank, step)``: a replayed step draws the
same numbers. A replacement asks the servers for the first step its rank has
not pushed every key of, and its loops start there: the steps before are
skipped, the one it resumes at is replayed (its pushes already applied are
skipped by the servers, its pulls read the values as of its start).

A pull of a key the rank has pushed in the same step (a torch loop's, which
pushes gradients, then pulls the weights in ``opt.step()``) reads the key after
that push's round: as of the start of the next step, which is what it carries.
A replay then reads what the lost incarnation read, whichever of its pushes
were applied before it was lost.

``hooks`` run at the start of every step, before the loop's body, and at the
end of a loop: ``hook(number, resumed)``, ``number`` the step that starts (the
one after the loop at its end), ``resumed`` once, where a replacement resumes
(a :class:`labkv.torch.DistributedOptimizer` keeps and restores there what the
store does not hold, see :mod:`labkv.torch._resume`).

Barriers are numbered ``(phase, n)``, the ``n``-th of a phase: ``2s + 2``
inside step ``s``, ``2k + 1`` after ``k`` steps, outside any loop (1 before
the first), so that a replacement's barriers line up with its rank's even
though it skips the steps before its resume step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Step:
    """One step of ``kv.steps(n)``: ``index`` within its loop (0 to n - 1),
    ``number`` over all the rank's loops, and ``rng``, a numpy Generator seeded
    by ``(seed, rank, number)`` (use it, not a generator kept across steps, for
    anything random in the step: a replay then draws the same numbers)."""

    index: int
    number: int
    rng: np.random.Generator


class StepCounter:
    """Where rank ``rank`` is in its step loops; ``resume()`` asks the servers
    where a replacement starts (called once, at its first loop)."""

    __slots__ = (
        "rank",
        "seed",
        "resume",
        "current",
        "pushing",
        "offset",
        "phase",
        "in_phase",
        "pushed",
        "hooks",
        "_start",
        "_resumed",
        "total",
    )

    def __init__(self, rank: int, seed: int, resume: Callable[[], int] | None) -> None:
        self.rank, self.seed, self.resume = rank, seed, resume
        self.current: int | None = None  # the step the rank's pulls read as of (None: none yet)
        self.pushing: int | None = None  # the step the rank's pushes are in (None: no loop)
        self.offset = 0  # steps of the loops before this one
        self.phase, self.in_phase = 1, 0  # barriers: see module doc
        self.pushed: set[Any] = set()  # the keys pushed in the current step
        self.hooks: list[Callable[[int, bool], None]] = []  # see module doc
        self._start: int | None = None  # a replacement's first step (asked once)
        self._resumed = resume is None  # whether the hooks were told of the resume step
        self.total = 0  # the step the current (or last) loop ends at

    def loop(self, n: int, seed: int | None) -> Iterator[Step]:
        """The steps of one loop of ``n`` (a replacement's start at its resume step)."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"steps(n) needs a non-negative int n, got {n!r}")
        seed = self.seed if seed is None else seed
        if self._start is None:
            self._start = 0 if self.resume is None else self.resume()
        offset = self.offset
        self.total = offset + n
        first = min(n, max(0, self._start - offset))
        try:
            for index in range(first, n):
                number = offset + index
                self.current = self.pushing = number
                self.phase, self.in_phase = 2 * number + 2, 0
                self.pushed = set()
                self._started(number)
                yield Step(index, number, np.random.default_rng([seed, self.rank, number]))
            self.current, self.pushing, self.pushed = offset + n, None, set()
            self._started(offset + n)
        finally:
            self.pushed = set()
            self.offset = offset + n
            # Later pulls read what every step of the loop made; later pushes are
            # outside any step (not replayed: a replacement's are new pushes).
            self.current, self.pushing = self.offset, None
            self.phase, self.in_phase = 2 * self.offset + 1, 0

    def _started(self, number: int) -> None:
        resumed = not self._resumed and number == self._start
        self._resumed = self._resumed or resumed
        for hook in list(self.hooks):
            hook(number, resumed)

    def reads(self, items: list, key: Callable[[Any], Any]) -> list[tuple[int | None, list]]:
        """A pull's ``items`` (``key(item)`` its key) grouped by the step the
        pull of them carries: ``current``, or the next step for the keys pushed
        in this step (see module doc)."""
        if self.pushing is None or not self.pushed:
            return [(self.current, items)]
        after = [i for i in items if key(i) in self.pushed]
        if len(after) == len(items):
            return [(self.pushing + 1, items)]
        before = [i for i in items if key(i) not in self.pushed]
        return [(self.current, before)] + ([(self.pushing + 1, after)] if after else [])

    def barrier(self) -> tuple[int, int]:
        """The generation of the rank's next barrier (see module doc)."""
        generation = (self.phase, self.in_phase)
        self.in_phase += 1
        return generation


def resume_step(calls: Any, rank: int) -> int:
    """Where a replacement of ``rank`` starts (``calls``: its
    :class:`~labkv.cluster._rank.calls.Calls`): the first step its rank has
    not pushed every key of, on every server."""
    found = [s for s in calls.all("resume_step", rank) if s is not None]
    return min(found, default=0)
