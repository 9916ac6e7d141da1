"""dist_ssp clocks, as plain logic: may a pull return, and who is it waiting for?

A server keeps each rank's clock per key (ticked after the rank's push); a
pull of rank r returns once the slowest rank is at most ``staleness`` rounds
behind r's clock. A pull names its sender, not its rank, so the clocks also
keep each sender's rank, learnt from its pushes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ClocksSnapshot:
    """:class:`Clocks` as a new replica takes it."""

    num_workers: int
    clocks: dict[Any, list[int]]
    ranks: dict[str, int]
    gone: list[int]


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

    __slots__ = ("staleness", "num_workers", "clocks", "ranks", "gone")

    def __init__(self, staleness: int, num_workers: int) -> None:
        self.staleness, self.num_workers = staleness, num_workers
        self.clocks: dict[Any, list[int]] = {}  # key -> clock per rank
        self.ranks: dict[str, int] = {}  # sender -> its rank
        self.gone: set[int] = set()  # ranks the run goes on without (their clocks stop)

    def pushed(self, sender: str, rank: int, keys: list[Any]) -> None:
        """``sender`` (rank ``rank``) pushed ``keys`` once (applied, or failed:
        it still counts, so that no other rank waits for it forever)."""
        self.ranks[sender] = rank
        self.tick(rank, keys)

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
        if need <= 0:
            return True
        gone = self.gone
        return len(row) >= self.num_workers and all(
            c >= need for r, c in enumerate(row) if r not in gone
        )

    def drop(self, rank: int) -> None:
        """The run goes on without ``rank``: no pull waits for its clocks.

        >>> c = Clocks(staleness=0, num_workers=2)
        >>> c.tick(0, ["w"]); c.ready("w", rank=0)
        False
        >>> c.drop(1); c.ready("w", rank=0), c.slowest("w")
        (True, ([0], 1))
        """
        self.gone.add(rank)

    def slowest(self, key: Any) -> tuple[list[int], int]:
        """The live ranks with the lowest clock of ``key``, and that clock."""
        clocks = {r: c for r, c in self.of(key).items() if r not in self.gone}
        low = min(clocks.values())
        return [r for r, c in clocks.items() if c == low], low

    def behind(self, key: Any, rank: int) -> str:
        """What ``rank``'s pull of ``key`` waits for, naming the slowest ranks."""
        clocks = self.of(key)
        need = self.needed(key, rank)
        late = {r: c for r, c in clocks.items() if c < need and r not in self.gone}
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
        self.gone.clear()

    def snapshot(self) -> ClocksSnapshot:
        """A copy of the clocks and the senders' ranks.

        >>> c = Clocks(staleness=1, num_workers=2)
        >>> c.pushed("a", 1, ["w"])
        >>> again = Clocks(staleness=1, num_workers=1)
        >>> again.restore(c.snapshot()); again.of("w"), again.ranks
        ({0: 0, 1: 1}, {'a': 1})
        """
        clocks = {k: list(row) for k, row in self.clocks.items()}
        return ClocksSnapshot(self.num_workers, clocks, dict(self.ranks), sorted(self.gone))

    def restore(self, snap: ClocksSnapshot) -> None:
        self.num_workers = snap.num_workers
        self.clocks = {k: list(row) for k, row in snap.clocks.items()}
        self.ranks = dict(snap.ranks)
        self.gone = set(snap.gone)
