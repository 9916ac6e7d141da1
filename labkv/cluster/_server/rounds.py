"""dist_sync rounds and failed updates, as plain logic (no Dask, no asyncio).

Per key, a server collects one push per rank into the open round; the W-th
completes it, and the round's update runs once. An update that fails (a
custom updater raised) is a :class:`Failure`: its exception reaches each rank
whose push was in the round exactly once (at that rank's next pull of the
key), and later pulls get the unchanged value, as on the local store. A
borrowed value that waits for its round is copied (:class:`Staging`).

>>> r = Round()
>>> r.join(rank=0, sender="a", seq=0, value=1.0)
>>> r.missing(num_workers=2)
[1]
>>> r.join(rank=1, sender="b", seq=4, value=2.0)
>>> failure = Failure(ValueError("no"), server=0, keys=["w"], senders=pushed_by(["w"], {"w": r}))
>>> r.finish(failure)
>>> r.done, r.pending
(1, {})
>>> type(r.report_to("b")).__name__, r.report_to("b")
('ValueError', None)
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import cloudpickle

from ..._types import Key
from ...devices import Device, copy_into, empty
from .._errors import Failure

#: Failures kept for senders that have not pulled since (per key; older ones are dropped).
KEEP_FAILURES = 100


def pushed_by(keys: list[Any], rounds: dict[Any, Round]) -> dict[str, dict]:
    """sender -> {key: seq} of the pushes in the open rounds of ``keys``."""
    senders: dict[str, dict] = {}
    for key in keys:
        for sender, seq in rounds[key].senders.items():
            senders.setdefault(sender, {})[key] = seq
    return senders


def failure_note(server: int, keys: list[Any], rounds: dict[Any, int] | None = None) -> str:
    """The note an updater's exception gets: where it was raised and what it left."""
    when = ""
    if rounds:
        numbers = sorted(set(rounds.values()))
        when = f" in round {numbers[0]}" if len(numbers) == 1 else f" in rounds {rounds}"
    return (
        f"raised by the updater on server {server}: the update of keys {keys}{when} "
        "failed, and no part of those keys changed"
    )


class Round:
    """dist_sync bookkeeping of one key on one server (see module doc)."""

    __slots__ = ("done", "pending", "senders", "first_push", "failures", "issued")

    def __init__(self, done: int = 0) -> None:
        self.done = done  # completed rounds
        # the open round's update is applied and sent to the backups, and waits
        # for their acknowledgement to complete (see ``ReplicaLog.rounds_done``)
        self.issued = False
        self.pending: dict[int, Any] = {}  # rank -> value pushed in round `done`
        self.senders: dict[str, int] = {}  # sender -> seq of its push in round `done`
        self.first_push: float | None = None
        self.failures: dict[int, Failure] = {}  # round -> its failed update

    def join(self, rank: int, sender: str, seq: int, value: Any) -> None:
        """Rank ``rank``'s push (``seq``-th message of ``sender``) joins the open round."""
        self.pending[rank] = value
        self.senders[sender] = seq

    def missing(self, num_workers: int) -> list[int]:
        return sorted(set(range(num_workers)) - set(self.pending))

    def finish(self, failure: Failure | None = None) -> None:
        """Close the open round (its update applied, or failed as ``failure``)."""
        if failure is not None:
            self.failures[self.done] = failure
        stale = [
            g for g, f in self.failures.items() if g < self.done - KEEP_FAILURES or not f.untold
        ]
        for g in stale:
            del self.failures[g]
        self.done += 1
        self.pending, self.senders, self.first_push = {}, {}, None
        self.issued = False

    def report_to(self, sender: str) -> BaseException | None:
        """The earliest failure not yet reported to ``sender`` (once), or None."""
        for g in sorted(self.failures):
            exc = self.failures[g].report_to(sender)
            if exc is not None:
                return exc
        return None


@dataclass
class RoundsSnapshot:
    """:class:`SyncRounds` as a new replica takes it: each key's completed
    rounds (a round whose update is applied and sent to the backups counts as
    completed: the snapshot holds its update, and the new replica never gets its
    log entry) and the failures still owed (cloudpickled, as an updater's error may
    be of a notebook's class: ``[(error, keys, untold, [(key, round)])]``, each
    failure once with every round it closed)."""

    num_workers: int
    done: dict[Any, int]
    failures: bytes


class SyncRounds:
    """dist_sync rounds of every key on one server: who pushed which key in
    which round, what completes a round, which round a pull waits for.

    >>> rounds = SyncRounds(num_workers=2)
    >>> rounds.add("w")
    >>> rounds.join("w", rank=0, sender="a", seq=0, value=1.0, now=0.0)
    False
    >>> rounds.ahead("w", rank=0), rounds.completes("w")  # rank 0 waits; one more completes
    (True, True)
    >>> rounds.missing("w")
    "ranks [1] have not pushed key 'w' in round 0"
    >>> rounds.pull_ready("a", "w"), rounds.pull_ready("b", "w")  # b never pushed w
    (False, True)
    >>> rounds.join("w", rank=1, sender="b", seq=3, value=2.0, now=0.1)
    True
    >>> rounds["w"].finish(); rounds.pull_ready("a", "w")
    True
    """

    __slots__ = ("num_workers", "rounds", "joined")

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self.rounds: dict[Any, Round] = {}
        self.joined: dict[tuple[str, Any], int] = {}  # (sender, key) -> round of its last push

    def add(self, key: Any) -> None:
        """A new key: no round completed, none open."""
        self.rounds[key] = Round()

    def __getitem__(self, key: Any) -> Round:
        return self.rounds[key]

    def values(self) -> Any:
        return self.rounds.values()

    def ahead(self, key: Any, rank: int) -> bool:
        """Whether ``rank`` already pushed ``key`` in the open round: its next
        push waits until the round completes."""
        return rank in self.rounds[key].pending

    def completes(self, key: Any) -> bool:
        """Whether one more push completes the open round of ``key``."""
        return len(self.rounds[key].pending) + 1 >= self.num_workers

    def join(self, key: Any, rank: int, sender: str, seq: int, value: Any, now: float) -> bool:
        """``rank``'s push (``sender``'s ``seq``-th message) joins the open round
        of ``key`` at time ``now``; whether that completes the round."""
        r = self.rounds[key]
        if not r.pending:
            r.first_push = now
        r.join(rank, sender, seq, value)
        self.joined[(sender, key)] = r.done
        return len(r.pending) >= self.num_workers

    def pull_ready(self, sender: str, key: Any) -> bool:
        """Whether ``sender``'s pull of ``key`` may read it: the round its last
        push of ``key`` joined has completed (at once for a sender that never
        pushed ``key``, e.g. the notebook watching)."""
        joined = self.joined.get((sender, key))
        return joined is None or self.rounds[key].done > joined

    def pushed(self, sender: str, key: Any) -> bool:
        """Whether ``sender`` pushed ``key`` here (its pull then reads its own round)."""
        return (sender, key) in self.joined

    def missing(self, key: Any) -> str:
        """What the open round of ``key`` waits for, naming the ranks."""
        r = self.rounds[key]
        return f"ranks {r.missing(self.num_workers)} have not pushed key {key!r} in round {r.done}"

    def resize(self, num_workers: int) -> None:
        """Wait for ``num_workers`` ranks from now on; refused while a round is
        open (its pushes were counted against the old number)."""
        open_rounds = [k for k, r in self.rounds.items() if r.pending]
        if open_rounds and num_workers != self.num_workers:
            raise ValueError(f"keys {open_rounds} have an open round")
        self.num_workers = num_workers

    def drop_open(self) -> None:
        """Forget every open round (an aborted run)."""
        for r in self.rounds.values():
            r.pending, r.senders, r.first_push = {}, {}, None

    def lowest_open(self, sender: str, low: int) -> int:
        """The lowest of ``low`` and the seqs of ``sender``'s pushes in open rounds."""
        for r in self.rounds.values():
            seq = r.senders.get(sender)
            if seq is not None and seq < low:
                low = seq
        return low

    def waiting(self) -> list[tuple[Any, int]]:
        """``(key, rank)`` of every push waiting in an open round whose update is
        not issued yet (see :class:`RoundsSnapshot`)."""
        rounds = self.rounds.items()
        return [(key, rank) for key, r in rounds if not r.issued for rank in r.pending]

    def snapshot(self) -> RoundsSnapshot:
        """Completed rounds (an issued one among them) and owed failures; open
        rounds are not taken (their pushes are resent to a new primary).

        >>> rounds = SyncRounds(num_workers=1)
        >>> rounds.add("w"); rounds.add("b")
        >>> failure = Failure(ValueError("no"), server=0, keys=["w", "b"], senders={"a": {"w": 0}})
        >>> rounds["w"].finish(failure); rounds["b"].finish(failure); rounds["b"].finish()
        >>> again = SyncRounds(num_workers=3)
        >>> again.restore(rounds.snapshot(), server=0)
        >>> again.num_workers, again["b"].done, again["w"].failures[0] is again["b"].failures[0]
        (1, 2, True)
        """
        failures: dict[int, tuple[Failure, list]] = {}
        for key, r in self.rounds.items():
            for g, failure in r.failures.items():
                failures.setdefault(id(failure), (failure, []))[1].append((key, g))
        owed = [(f.error, f.keys, f.untold, rounds) for f, rounds in failures.values()]
        done = {k: r.done + r.issued for k, r in self.rounds.items()}
        return RoundsSnapshot(self.num_workers, done, cloudpickle.dumps(owed))

    def restore(self, snap: RoundsSnapshot, server: int) -> None:
        """Take ``snap`` (see :meth:`snapshot`); its failures are now ``server``'s."""
        self.num_workers = snap.num_workers
        for key, done in snap.done.items():
            self.rounds[key] = Round(done)
        for error, keys, untold, rounds in pickle.loads(snap.failures):
            failure = Failure(error, server, keys, untold)
            for key, g in rounds:
                self.rounds[key].failures[g] = failure


class Staging:
    """Copies of borrowed values that wait for their round: one buffer per key
    and rank, free again once the rank's previous value of the key was applied
    (a rank has at most one value pending per key)."""

    __slots__ = ("device", "buffers")

    def __init__(self, device: Device) -> None:
        self.device = device
        self.buffers: dict[tuple[Key, int], Any] = {}

    def copy(self, key: Key, rank: int, value: Any) -> Any:
        if getattr(value, "stype", None) == "row_sparse":
            return value  # the rank sends a copy of its rows (labkv.cluster._rows.rank)
        stage = self.buffers.get((key, rank))
        if stage is None or stage.shape != value.shape or stage.dtype != value.dtype:
            stage = self.buffers[(key, rank)] = empty(value.shape, value.dtype, self.device)
        copy_into(stage, value)
        return stage
