"""Reading one rank's share of an epoch, window by window, as raw minibatches."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ._batch import Minibatch, concat
from ._epoch_order import EpochOrder
from ._partition import Partition
from ._sources import Source

__all__ = ["Reader"]


class Reader:
    """Gathers samples from a source's chunks and cuts them into minibatches.

    Memory: at most the samples of one window (gathered), one chunk (being
    read) and the minibatch being assembled.
    """

    def __init__(self, source: Source, partition: Partition, rank: int) -> None:
        self.source = source
        self.partition = partition
        self.rank = rank
        self.starts = np.concatenate([[0], np.cumsum(source.chunk_sizes, dtype=np.int64)])
        self._layout: dict[str, tuple[tuple, np.dtype]] = {}

    def gather(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """The samples ``ids`` (in that order), reading each chunk once."""
        chunk = np.searchsorted(self.starts, ids, side="right") - 1
        by_chunk = np.argsort(chunk, kind="stable")
        cuts = np.flatnonzero(np.diff(chunk[by_chunk])) + 1
        out: dict[str, np.ndarray] = {}
        for sel in np.split(by_chunk, cuts):
            c = int(chunk[sel[0]])
            rows = ids[sel] - self.starts[c]
            # Ascending rows: a memmap is then read front to back.
            ordered = np.argsort(rows)
            sel, rows = sel[ordered], rows[ordered]
            data = self.source.read_chunk(c)
            for name in self.source.names:
                values = self._checked(data, name, c)
                if name not in out:
                    out[name] = np.empty((len(ids), *values.shape[1:]), dtype=values.dtype)
                out[name][sel] = values[rows]
            del data, values  # unmaps a memmapped chunk before the next is mapped
        return out

    def _checked(self, data: Any, name: str, c: int) -> np.ndarray:
        if name not in data:
            raise KeyError(f"chunk {c} of the source has no field {name!r}")
        values = np.asarray(data[name])
        size = int(self.starts[c + 1] - self.starts[c])
        if values.ndim == 0 or values.shape[0] != size:
            raise ValueError(
                f"chunk {c} of field {name!r} has {values.shape[:1] or 'no'} samples, "
                f"expected {size}"
            )
        layout = (values.shape[1:], values.dtype)
        seen = self._layout.setdefault(name, layout)
        if seen != layout:
            raise ValueError(
                f"field {name!r}: chunk {c} holds samples of shape {layout[0]} {layout[1]}, "
                f"earlier chunks hold {seen[0]} {seen[1]}"
            )
        return values

    def epoch(self, order: EpochOrder) -> Iterator[Minibatch]:
        """This rank's minibatches of one epoch (raw: not padded, not on a device)."""
        p, batch = self.partition, self.partition.batch_size
        _, own = p.block(self.rank)
        pending: list[Minibatch] = []
        have, k, step = 0, 0, 0
        for start, stop in p.segments(self.rank):
            for ids in order.pieces(start, stop):
                padding = np.arange(k, k + len(ids)) >= own
                k += len(ids)
                pending.append(Minibatch(self.gather(ids), ids, padding, order.epoch))
                have += len(ids)
                while have >= batch:
                    have -= batch
                    mb = concat(_take(pending, batch), step)
                    mb.sweep_end = step == p.steps - 1
                    step += 1
                    yield mb
                if pending:
                    # Copy the short leftover so it does not pin this window's buffer
                    # while the next window is gathered.
                    pending = [concat(pending, step)]
        assert step == p.steps and have == 0, (step, have)

    def at(self, order: EpochOrder, step: int) -> Minibatch:
        """This rank's ``step``-th minibatch of one epoch, as :meth:`epoch` yields
        it, read on its own (only its samples' chunks)."""
        p, batch = self.partition, self.partition.batch_size
        positions, padding = p.positions(self.rank)
        window = slice(step * batch, (step + 1) * batch)
        pos, pad = positions[window], padding[window]
        runs = np.split(pos, np.flatnonzero(np.diff(pos) != 1) + 1)  # the order wraps once
        ids = np.concatenate([order.ids(int(r[0]), int(r[-1]) + 1) for r in runs])
        mb = concat([Minibatch(self.gather(ids), ids, pad, order.epoch)], step)
        mb.sweep_end = step == p.steps - 1
        return mb

    def stream(self, epochs: Iterator[EpochOrder]) -> Iterator[Minibatch]:
        """Minibatches of epoch after epoch."""
        for order in epochs:
            yield from self.epoch(order)


def _take(pending: list[Minibatch], batch: int) -> list[Minibatch]:
    """Remove the first ``batch`` samples from ``pending``, as a list of parts.

    A function of its own so that no local name keeps a view of a window's
    buffer alive after the minibatch is copied out of it.
    """
    parts, need = [], batch
    while need:
        head = pending[0]
        n = head.num_samples
        if n <= need:
            parts.append(pending.pop(0))
            need -= n
        else:
            parts.append(head.slice(0, need))
            pending[0] = head.slice(need, n)
            need = 0
    return parts
