"""Splitting one epoch of samples across ranks so that every rank takes the same
number of steps.

The epoch order is a sequence of ``N`` positions (``0 .. N-1``, later mapped to
sample ids by the shuffle). Rank ``r`` owns a contiguous *block* of that order,
the blocks are balanced (their sizes differ by at most one) and together cover
it exactly once. Every rank then yields ``steps`` full minibatches of
``batch_size`` samples:

* ``drop_last=False``: ``steps = ceil(N / (W * B))``; a rank whose block is
  shorter than ``steps * B`` is padded by reading on, round the epoch order, into
  the next blocks (so padding duplicates samples of this epoch and is marked).
* ``drop_last=True``: ``steps = floor(N / (W * B))``; each rank keeps the first
  ``steps * B`` positions of its block and drops the rest (fewer than ``B + 1``
  per rank, fewer than ``W * B`` in all).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Partition", "plan_partition"]


@dataclass(frozen=True)
class Partition:
    """How one epoch of ``num_samples`` is split over ``num_workers`` ranks.

    >>> p = plan_partition(10, batch_size=2, num_workers=4)
    >>> p.steps, [p.block(r) for r in range(4)]
    (2, [(0, 3), (3, 3), (6, 2), (8, 2)])
    >>> p.positions(3)
    (array([8, 9, 0, 1]), array([False, False,  True,  True]))
    """

    num_samples: int
    batch_size: int
    num_workers: int
    drop_last: bool
    steps: int

    @property
    def samples_per_rank(self) -> int:
        """Samples each rank yields per epoch (padding included): ``steps * batch_size``."""
        return self.steps * self.batch_size

    def block(self, rank: int) -> tuple[int, int]:
        """``(start, length)`` of the block of the epoch order that ``rank`` owns."""
        self._check_rank(rank)
        base, extra = divmod(self.num_samples, self.num_workers)
        return rank * base + min(rank, extra), base + (rank < extra)

    def positions(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions in the epoch order that ``rank`` reads, in order, and a mask
        that is True where a position is padding (a duplicate from another block)."""
        start, length = self.block(rank)
        k = np.arange(self.samples_per_rank, dtype=np.int64)
        return (start + k) % self.num_samples, k >= length

    def segments(self, rank: int) -> list[tuple[int, int]]:
        """The positions of :meth:`positions` as ``[start, stop)`` runs (split where
        padding wraps round the end of the epoch order)."""
        start, _ = self.block(rank)
        todo, out = self.samples_per_rank, []
        pos = start % self.num_samples if self.num_samples else 0
        while todo > 0:
            stop = min(self.num_samples, pos + todo)
            out.append((pos, stop))
            todo -= stop - pos
            pos = 0
        return out

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.num_workers:
            raise ValueError(f"rank must be in [0, {self.num_workers}), got {rank}")


def plan_partition(
    num_samples: int, batch_size: int, num_workers: int = 1, drop_last: bool = False
) -> Partition:
    """Plan an epoch: equal steps for every rank, padding or dropping as asked.

    Raises ``ValueError`` when there is nothing to read (no samples, or with
    ``drop_last=True`` fewer than ``num_workers * batch_size`` samples), so
    that training fails loudly instead of running an empty loop.

    >>> plan_partition(10, batch_size=4, num_workers=2).steps
    2
    >>> plan_partition(10, batch_size=4, num_workers=2, drop_last=True).steps
    1
    """
    for name, value, low in (
        ("num_samples", num_samples, 0),
        ("batch_size", batch_size, 1),
        ("num_workers", num_workers, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if num_samples == 0:
        raise ValueError("the source has no samples: nothing to iterate over")
    per_step = num_workers * batch_size
    if drop_last:
        steps = num_samples // per_step
        if steps == 0:
            raise ValueError(
                f"drop_last=True needs at least num_workers * batch_size = {per_step} samples "
                f"for one step, but the source has {num_samples}; use drop_last=False "
                "(pad) or a smaller batch_size"
            )
    else:
        steps = -(-num_samples // per_step)
    return Partition(int(num_samples), int(batch_size), int(num_workers), bool(drop_last), steps)
