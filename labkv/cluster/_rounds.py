"""dist_sync rounds and failed updates, as plain logic (no Dask, no asyncio).

Per key, a server collects one push per rank into the open round; the W-th
completes it, and the round's update runs once. An update that fails (a
custom updater raised) is a :class:`Failure`: its exception reaches each rank
whose push was in the round exactly once (at that rank's next pull of the
key), and later pulls get the unchanged value, as on the local store.

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

import copy
import pickle
from typing import Any

import cloudpickle

#: Failures kept for senders that have not pulled since (per key; older ones are dropped).
KEEP_FAILURES = 100


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (Python 3.11+), or the same ``__notes__`` list before."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10: kept in the attribute 3.11's traceback prints
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]


def portable(exc: BaseException) -> BaseException:
    """``exc`` when it survives pickling as Dask pickles (cloudpickle: classes
    of ``__main__`` travel by value), else a ``RuntimeError`` with the same text."""
    try:
        pickle.loads(cloudpickle.dumps(exc))
    except Exception:
        plain = RuntimeError(f"{type(exc).__name__}: {exc}")
        plain.__notes__ = list(getattr(exc, "__notes__", []))
        return plain
    return exc


class Failure:
    """A failed update on one server: the updater's own exception (with a
    note naming the server, keys and rounds), owed once to each sender whose
    pushes the update held (``senders``: sender -> {key: sequence number of
    the push that carried it})."""

    __slots__ = ("error", "server", "keys", "untold")

    def __init__(
        self, error: BaseException, server: int, keys: list[Any], senders: dict[str, dict]
    ):
        self.error, self.server, self.keys = error, server, list(keys)
        self.untold = {sender: dict(seqs) for sender, seqs in senders.items()}

    def report_to(self, sender: str) -> BaseException | None:
        """The exception for ``sender`` the first time it asks; None after that
        (or when none of its pushes was in the failed update). It carries which
        of the sender's pushes failed (``_labkv_update``), so the sender can
        restore what it committed for them (compression residuals)."""
        seqs = self.untold.pop(sender, None)
        if seqs is None:
            return None
        exc = copy.copy(self.error)
        exc._labkv_update = {"server": self.server, "seqs": seqs}
        return exc


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

    __slots__ = ("done", "pending", "senders", "first_push", "failures")

    def __init__(self) -> None:
        self.done = 0  # completed rounds
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

    def report_to(self, sender: str) -> BaseException | None:
        """The earliest failure not yet reported to ``sender`` (once), or None."""
        for g in sorted(self.failures):
            exc = self.failures[g].report_to(sender)
            if exc is not None:
                return exc
        return None


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


class UpdateQueue:
    """dist_async updates of one sliced key on one server, applied in the order
    server 0 received them (every server of the key follows that order, so the
    slices of each update commit together; see ``Server._advance``).

    A push is ``(sender, n)``: the ``n``-th push of the key by ``sender``, the
    same push on every server (a sender's pushes reach each server in order).

    >>> q = UpdateQueue()
    >>> q.arrive("a", value=1.0, seq=7, leader=False)
    >>> q.take(0) is None  # server 0 has not said which push is first
    True
    >>> q.learn(0, ("a", 0))
    >>> q.take(0)
    (('a', 0), 1.0, 7)
    """

    __slots__ = ("data", "order", "assigned", "arrived", "undecided", "busy")

    def __init__(self) -> None:
        self.data: dict[tuple[str, int], tuple[Any, int]] = {}  # push -> (value, seq)
        self.order: dict[int, tuple[str, int]] = {}  # position -> push
        self.assigned = 0  # on server 0: the next position to give
        self.arrived: dict[str, int] = {}  # sender -> pushes of the key received
        self.undecided: dict[str, int] = {}  # sender -> its pushes not yet decided
        self.busy = False  # an update is prepared and waits for the other servers

    def arrive(self, sender: str, value: Any, seq: int, leader: bool) -> None:
        n = self.arrived.get(sender, 0)
        self.arrived[sender] = n + 1
        self.undecided[sender] = self.undecided.get(sender, 0) + 1
        self.data[(sender, n)] = (value, seq)
        if leader and (sender, n) not in self.order.values():  # not placed before a failover
            self.order[self.assigned] = (sender, n)
            self.assigned += 1

    def learn(self, position: int, push: tuple[str, int]) -> None:
        """Server 0 says which push is the ``position``-th update."""
        self.order.setdefault(position, tuple(push))

    def applied(self, sender: str) -> None:
        """A backup applied an update of ``sender``'s next push (the primary's
        log entry): a new primary numbers that sender's later pushes on."""
        self.arrived[sender] = self.arrived.get(sender, 0) + 1

    def resume(self, done: int, told: dict[int, tuple[str, int]]) -> None:
        """Server 0's new primary, ``done`` updates decided: the pushes its old
        primary placed at the positions in ``told`` (and told the other servers)
        keep them; new pushes are placed after."""
        for position, push in told.items():
            if position >= done:
                self.learn(position, push)
        self.assigned = max([self.assigned, done, *(p + 1 for p in self.order)])

    def take(self, position: int) -> tuple[tuple[str, int], Any, int] | None:
        """The push to apply as update ``position``, once its order and data are here."""
        if self.busy:
            return None
        push = self.order.get(position)
        if push is None or push not in self.data:
            return None
        del self.order[position]
        value, seq = self.data.pop(push)
        self.busy = True
        return push, value, seq

    def decided(self, sender: str) -> None:
        self.busy = False
        self.undecided[sender] -= 1


def check_staleness(kind: str, staleness: Any) -> int | None:
    """The staleness bound of a store of ``kind`` (None for kinds without one);
    a ``dist_ssp`` store needs a non-negative int, the others take none.

    >>> check_staleness("dist_ssp", 2), check_staleness("dist_sync", None)
    (2, None)
    >>> check_staleness("dist_ssp", -1)
    Traceback (most recent call last):
    ...
    ValueError: staleness must be a non-negative int (rounds), got -1
    >>> check_staleness("dist_async", 3)
    Traceback (most recent call last):
    ...
    ValueError: staleness applies to 'dist_ssp' stores only, not 'dist_async'
    """
    if kind != "dist_ssp":
        if staleness is not None:
            raise ValueError(f"staleness applies to 'dist_ssp' stores only, not {kind!r}")
        return None
    if staleness is None:
        raise ValueError(
            "a 'dist_ssp' store needs staleness=s: how many rounds a rank may run "
            "ahead of the slowest (0: as dist_sync; large: as dist_async)"
        )
    if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
        raise ValueError(f"staleness must be a non-negative int (rounds), got {staleness!r}")
    return staleness


class Clocks:
    """dist_ssp (stale synchronous parallel) clocks of the keys on one server.

    A rank's clock of a key is the number of its pushes of that key applied
    here: one push advances the clock of every key it carries by one (a list
    push is one round for each of its keys; per-device values of a key are one
    push). Pushes are applied as they arrive, as in dist_async; only a pull
    waits: a pull of ``key`` by a rank at clock ``c`` returns once every rank's
    clock of ``key`` is at least ``c - staleness``. ``staleness=0`` is
    bulk-synchronous (a pull sees every rank's pushes of the rounds before);
    a large bound never waits, as dist_async.

    >>> c = Clocks(staleness=1, num_workers=2)
    >>> c.tick(0, ["w"]); c.tick(0, ["w"]); c.tick(1, ["w"])
    >>> c.of("w")
    {0: 2, 1: 1}
    >>> c.ready("w", rank=0)  # rank 0 at clock 2 needs every rank at 1
    True
    >>> c.tick(0, ["w"])
    >>> c.ready("w", rank=0)  # at clock 3 it needs rank 1 at 2
    False
    >>> c.behind("w", rank=0)
    "rank 0's pull of key 'w' at clock 3 (staleness 1) waits for every rank to reach clock 2; slowest: rank 1 at clock 1 (clocks: {0: 3, 1: 1})"
    """

    __slots__ = ("staleness", "num_workers", "clocks")

    def __init__(self, staleness: int, num_workers: int) -> None:
        self.staleness, self.num_workers = staleness, num_workers
        self.clocks: dict[Any, list[int]] = {}  # key -> clock per rank

    def tick(self, rank: int, keys: list[Any]) -> None:
        """``rank`` pushed each of ``keys`` once."""
        clocks = self.clocks
        for key in keys:
            row = clocks.get(key)
            if row is None:
                row = clocks[key] = [0] * max(self.num_workers, rank + 1)
            row[rank] += 1

    def of(self, key: Any) -> dict[int, int]:
        """rank -> clock of ``key`` (0 for a rank that has not pushed it)."""
        row = self.clocks.get(key, [])
        return {r: row[r] if r < len(row) else 0 for r in range(self.num_workers)}

    def clock(self, key: Any, rank: int) -> int:
        row = self.clocks.get(key)
        return row[rank] if row is not None and rank < len(row) else 0

    def needed(self, key: Any, rank: int) -> int:
        """The clock every rank must reach before ``rank`` may pull ``key``."""
        return self.clock(key, rank) - self.staleness

    def ready(self, key: Any, rank: int) -> bool:
        row = self.clocks.get(key)
        if row is None:
            return True  # nobody pushed it: every clock is 0
        need = (row[rank] if rank < len(row) else 0) - self.staleness
        return need <= 0 or (len(row) >= self.num_workers and min(row) >= need)

    def slowest(self, key: Any) -> tuple[list[int], int]:
        """The ranks with the lowest clock of ``key``, and that clock."""
        clocks = self.of(key)
        low = min(clocks.values())
        return [r for r, c in clocks.items() if c == low], low

    def behind(self, key: Any, rank: int) -> str:
        """What ``rank``'s pull of ``key`` waits for, naming the slowest ranks."""
        clocks = self.of(key)
        need = self.needed(key, rank)
        late = {r: c for r, c in clocks.items() if c < need}
        slow = ", ".join(f"rank {r} at clock {c}" for r, c in sorted(late.items()))
        return (
            f"rank {rank}'s pull of key {key!r} at clock {clocks[rank]} (staleness "
            f"{self.staleness}) waits for every rank to reach clock {need}; slowest: "
            f"{slow} (clocks: {clocks})"
        )

    def reset(self, num_workers: int) -> None:
        """Start over with ``num_workers`` ranks (a new run on the same servers)."""
        self.num_workers = num_workers
        self.clocks.clear()
