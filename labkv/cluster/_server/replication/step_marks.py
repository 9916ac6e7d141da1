"""What a server keeps so that a lost rank can be replaced mid-run: which step
each rank last pushed each key in (:class:`StepMarks`), and each key's value
one dist_sync round back.

A rank's pushes and pulls inside ``kv.steps(n)`` carry the step's index. A
replacement resumes at the first step some key lacks its push of
(:meth:`StepMarks.resume`) and replays it:

- a push of ``(key, rank, step)`` already here is a *replay*: skipped, and
  compared with the first: bit for bit while the first still waits in an open
  round (:meth:`StepMarks.audit`), else by the CRC-32 of the first, kept with
  its mark (:meth:`StepMarks.check`; about 5 ms a 16 MiB push, half of SHA-1's
  time, inside step loops only: a check for a computation that is not
  deterministic, not against an adversary, so a 32-bit check that misses one
  change in 4 billion is enough). A mismatch means the rank's computation is not deterministic,
  and is counted;
- a dist_sync pull of step ``s`` reads the key as of the start of step ``s``:
  the value one round back when the rank's step-``s`` push already completed
  its round (:meth:`StepMarks.as_of`). No rank can be further ahead: a round
  needs every rank's push.

Every replica keeps the same marks and values one round back: the log entries
carry the marks (:attr:`~labkv.cluster._protocol.entries.Entry.marks`), and a
backup keeps the value before it applies a round. A primary marks a dist_sync
push as it joins its open round, before any entry holds it; a replica seeded
meanwhile gets no open round (its pushes are resent to a new primary), so its
seed carries, for each push waiting in an open round, the rank's mark before
it (:meth:`StepMarks.snapshot`): else a new primary would take the resent push
for a replay, skip it, and wait for that round forever. Calls without a step
(outside ``kv.steps``, the notebook's) leave no mark and cost nothing here.

>>> marks = StepMarks()
>>> marks.mark("w", rank=1, step=0, number=0)
>>> marks.replayed("w", rank=1, step=0), marks.replayed("w", rank=1, step=1)
(True, False)
>>> marks.resume(rank=1), marks.resume(rank=0)  # rank 0 never pushed w
(1, 0)
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ...._types import Key
from ....devices import new_like, to_device
from ....sparse import RowSparseArray
from ..._device import host_copy, host_view

if TYPE_CHECKING:
    from .ports import RoundsPort


@dataclass
class StepsSnapshot:
    """:class:`StepMarks` as a new replica takes it (values as host copies)."""

    last: dict[tuple[Key, int], tuple[int, int]]
    before: dict[Key, tuple[int, Any]]
    replays: int
    mismatches: list[tuple[Key, int, int]]
    digests: dict[tuple[Key, int], bytes] = field(default_factory=dict)


#: a mark as :class:`StepMarks` keeps it: ``(step, number)``, and its digest
_Mark = tuple[tuple[int, int], bytes]


class StepMarks:
    """The step marks and values one round back of one server (see module doc)."""

    __slots__ = ("last", "digests", "prior", "keys", "before", "replays", "mismatches")

    def __init__(self) -> None:
        # (key, rank) -> (step, number): the rank's last push of the key was in
        # that step, and joined the key's round (or dist_async update) number.
        self.last: dict[tuple[Key, int], tuple[int, int]] = {}
        self.digests: dict[tuple[Key, int], bytes] = {}  # (key, rank) -> its last push's
        # (key, rank) -> the mark before the last (None: none), which a seed
        # carries while the last push waits in an open round (see module doc)
        self.prior: dict[tuple[Key, int], _Mark | None] = {}
        self.keys: set[Key] = set()  # the keys of ``last``
        # key -> (round, value before that round was applied): the last round only.
        self.before: dict[Key, tuple[int, Any]] = {}
        self.replays = 0
        self.mismatches: list[tuple[Key, int, int]] = []  # (key, rank, step)

    def __bool__(self) -> bool:
        return bool(self.last)

    def mark(
        self, key: Key, rank: int, step: int, number: int, value: Any = None, sha: bytes = b""
    ) -> None:
        """``rank``'s push of ``key`` in ``step`` joined round (update) ``number``;
        its ``value``, or its digest ``sha`` (a backup's, from the log), is kept
        as a digest to check a replay against."""
        at = (key, rank)
        seen = self.last.get(at)
        self.prior[at] = None if seen is None else (seen, self.digests.get(at, b""))
        self.last[at] = (step, number)
        self.digests[at] = digest(value) if value is not None else sha
        self.keys.add(key)

    def replayed(self, key: Key, rank: int, step: int) -> bool:
        """Whether ``rank``'s push of ``key`` in ``step`` is here already."""
        seen = self.last.get((key, rank))
        return seen is not None and seen[0] >= step

    def joined(self, key: Key, rank: int) -> int | None:
        """The round ``rank``'s last marked push of ``key`` joined."""
        seen = self.last.get((key, rank))
        return None if seen is None else seen[1]

    def audit(self, key: Key, rank: int, step: int, first: Any, again: Any) -> bool:
        """A replayed push met its first, still waiting in an open round: whether
        they are the same bits (a mismatch is kept, the first one is used)."""
        self.replays += 1
        same = first.shape == again.shape and first.dtype == again.dtype
        same = same and bool(np.array_equal(host_view(first), host_view(again)))
        if not same:
            self.mismatches.append((key, rank, step))
        return same

    def check(self, key: Key, rank: int, step: int, again: Any) -> bool:
        """A replayed push whose first was applied already: whether its digest is
        the first's (a mismatch is kept; the first one was used)."""
        self.replays += 1
        first = self.digests.get((key, rank), b"")
        same = not first or self.last[(key, rank)][0] != step or digest(again) == first
        if not same:
            self.mismatches.append((key, rank, step))
        return same

    def fresh(self, items: list[tuple[Key, Any]], rank: int, step: int) -> list[tuple[Key, Any]]:
        """A dist_async push's ``items`` but the replayed ones, marked as pushed
        in ``step`` (update number -1: no value is kept one round back)."""
        kept = []
        for key, value in items:
            if self.replayed(key, rank, step):
                self.check(key, rank, step, value)
            else:
                self.mark(key, rank, step, -1, value)
                kept.append((key, value))
        return kept

    def replayed_round(
        self, rounds: RoundsPort, key: Key, rank: int, step: int, sender: str, value: Any
    ) -> None:
        """A dist_sync replay of ``rank``'s push of ``key`` in ``step``: compared
        with the first while that waits in the open round, else skipped;
        ``sender`` (the replacement) then reads the round it joined."""
        number = self.joined(key, rank)
        r = rounds[key]
        if r.done == number and rank in r.pending:
            self.audit(key, rank, step, r.pending[rank], value)
        else:
            self.check(key, rank, step, value)
        rounds.joined[(sender, key)] = number

    def before_step(
        self, rounds: RoundsPort, keys: list[Key], rank: int, step: int
    ) -> dict[Key, Any]:
        """The keys ``rank``'s dist_sync pull in ``step`` reads one round back
        (see :meth:`as_of`), with those values."""
        before = {}
        for key in keys:
            value = self.as_of(key, rank, step, rounds[key].done)
            if value is not None:
                before[key] = value
        return before

    def marked(self, key: Key) -> bool:
        """Whether some rank pushed ``key`` inside a step loop (its rounds then
        keep the value one round back)."""
        return key in self.keys

    def keep_before(self, key: Key, number: int, value: Any) -> None:
        """``value`` (a copy) is ``key`` before round ``number`` is applied."""
        self.before[key] = (number, value)

    def as_of(self, key: Key, rank: int, step: int, done: int) -> Any | None:
        """What ``rank``'s pull of ``key`` in ``step`` reads instead of the
        stored value: the value one round back when its push of this step
        already completed the round (``done`` rounds completed); else None."""
        seen = self.last.get((key, rank))
        if seen is None or seen[0] < step or done <= seen[1]:
            return None
        number, value = self.before.get(key, (None, None))
        if number != seen[1]:
            raise RuntimeError(
                f"rank {rank} replays step {step} of key {key!r}, whose round {seen[1]} "
                f"is no longer the last one kept (round {number} is)"
            )
        return value

    def resume(self, rank: int) -> int | None:
        """The first step ``rank`` has not pushed every marked key of (None: no
        key here was pushed in a step loop)."""
        if not self.keys:
            return None
        return min(self.last.get((k, rank), (-1, 0))[0] for k in self.keys) + 1

    def clear(self) -> None:
        """Forget every mark (a new run on these servers numbers its steps anew)."""
        self.last, self.digests, self.keys, self.before = {}, {}, set(), {}
        self.prior = {}

    def load(self) -> dict[str, Any]:
        return {"replayed": self.replays, "replay_mismatches": len(self.mismatches)}

    def snapshot(self, waiting: Iterable[tuple[Key, int]] = ()) -> StepsSnapshot:
        """The marks as a new replica takes them; ``waiting``: the ``(key, rank)``
        whose last push waits in an open round, which the snapshot does not
        hold: their marks before it.

        >>> marks = StepMarks()
        >>> marks.mark("w", rank=0, step=3, number=3); marks.mark("w", rank=0, step=4, number=4)
        >>> marks.mark("b", rank=0, step=4, number=0)
        >>> snap = marks.snapshot(waiting=[("w", 0), ("b", 0)])
        >>> snap.last
        {('w', 0): (3, 3)}
        """
        before = {k: (n, host_copy(v)) for k, (n, v) in self.before.items()}
        last, digests, mismatches = dict(self.last), dict(self.digests), list(self.mismatches)
        for at in waiting:
            prior = self.prior.get(at)
            if prior is None:
                last.pop(at, None)
                digests.pop(at, None)
            else:
                last[at], digests[at] = prior
        return StepsSnapshot(last, before, self.replays, mismatches, digests)

    def restore(self, snap: StepsSnapshot, device: Any) -> None:
        self.last, self.digests, self.prior = dict(snap.last), dict(snap.digests), {}
        self.keys = {k for k, _ in self.last}
        self.before = {
            k: (n, to_device(np.asarray(v), device)) for k, (n, v) in snap.before.items()
        }
        self.replays, self.mismatches = snap.replays, list(snap.mismatches)


def digest(value: Any) -> bytes:
    """The CRC-32 of a pushed value's bits, shape and dtype (dense or row-sparse,
    on any device), as 4 bytes.

    >>> a = np.arange(4, dtype=np.float32)
    >>> digest(a) == digest(a.copy()), digest(a) == digest(a + 1), digest(a) == digest(a[:3])
    (True, False, False)
    """
    crc = zlib.crc32(repr((type(value).__name__, tuple(value.shape))).encode())
    parts = [value.indices, value.data] if isinstance(value, RowSparseArray) else [value]
    for part in parts:
        part = np.ascontiguousarray(host_view(part))
        crc = zlib.crc32(part.dtype.str.encode(), crc)
        crc = zlib.crc32(part.reshape(-1).view(np.uint8).data, crc)
    return crc.to_bytes(4, "little")


def copied(value: Any) -> Any:
    """A copy of a stored value on its own device (``value.copy()`` of a CuPy
    array lands on the current device, not on the array's)."""
    return new_like(value, value)
