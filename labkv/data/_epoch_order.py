"""Chunked randomisation: the order in which one epoch visits the samples.

CNTK-style: shuffle the order of the chunks, cut that order into windows of
``window`` chunks, and shuffle the samples inside each window. A reader then
only needs one window of chunks in memory at a time. The order is a pure
function of ``(chunk sizes, window, seed, epoch)`` and is built lazily, one
window at a time, so the bookkeeping is O(number of chunks), not O(samples).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

__all__ = ["EpochOrder"]


class EpochOrder:
    """The sample order of one epoch, window by window.

    >>> o = EpochOrder([3, 3, 3], window=2, seed=0, epoch=0)
    >>> sorted(o.ids(0, 9).tolist()) == list(range(9))
    True
    >>> EpochOrder([3, 3], window=1, shuffle=False).ids(0, 6)
    array([0, 1, 2, 3, 4, 5])
    """

    def __init__(
        self,
        chunk_sizes: Sequence[int],
        window: int | None = 16,
        seed: int = 0,
        epoch: int = 0,
        shuffle: bool = True,
    ) -> None:
        sizes = np.asarray(chunk_sizes, dtype=np.int64)
        self.chunk_starts = np.concatenate([[0], np.cumsum(sizes)])
        self.num_samples = int(self.chunk_starts[-1])
        self.shuffle = shuffle
        self.seed, self.epoch = int(seed), int(epoch)
        self._key = (self.seed, self.epoch)
        nchunks = len(sizes)
        per_window = nchunks if window is None else max(1, int(window))
        if shuffle:
            chunks = np.random.default_rng([*self._key, 0]).permutation(nchunks)
        else:
            chunks = np.arange(nchunks)
        self.windows = [chunks[i : i + per_window] for i in range(0, nchunks, per_window)]
        self.window_starts = np.concatenate(
            [[0], np.cumsum([sizes[w].sum() for w in self.windows], dtype=np.int64)]
        )

    def window_ids(self, w: int) -> np.ndarray:
        """Sample ids of window ``w``, in the order the epoch visits them."""
        ids = np.concatenate(
            [np.arange(self.chunk_starts[c], self.chunk_starts[c + 1]) for c in self.windows[w]]
        )
        if self.shuffle:
            # One generator per window so any window can be built without the others.
            np.random.default_rng([*self._key, 1, w]).shuffle(ids)
        return ids

    def pieces(self, start: int, stop: int) -> Iterator[np.ndarray]:
        """Sample ids at positions ``[start, stop)``, one array per window touched."""
        w = int(np.searchsorted(self.window_starts, start, side="right")) - 1
        while start < stop:
            lo, hi = self.window_starts[w], self.window_starts[w + 1]
            ids = self.window_ids(w)
            yield ids[start - lo : min(stop, hi) - lo]
            start = int(hi)
            w += 1

    def ids(self, start: int, stop: int) -> np.ndarray:
        """Sample ids at positions ``[start, stop)`` as one array."""
        parts = list(self.pieces(start, stop))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
