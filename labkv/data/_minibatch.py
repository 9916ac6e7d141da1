"""``MinibatchSource``: shuffled, per-rank, prefetched minibatches from any source."""

from __future__ import annotations

import itertools
import numbers
import os
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ._batch import Minibatch, concat, finish
from ._ctf import CTFSource
from ._epoch_order import EpochOrder
from ._partition import Partition, plan_partition
from ._prefetch import Prefetcher
from ._reader import Reader
from ._sources import DEFAULT_CHUNK_BYTES, ArraySource, DaskSource, NpySource, Source

__all__ = ["MinibatchSource"]


class _EpochIterator:
    """One epoch of minibatches; closing it stops its prefetch thread."""

    def __init__(self, it: Iterator[Minibatch], steps: int) -> None:
        self._it, self._steps = it, steps

    def __iter__(self) -> _EpochIterator:
        return self

    def __next__(self) -> Minibatch:
        return next(self._it)

    def __len__(self) -> int:
        return self._steps

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            close()

    def __del__(self) -> None:
        self.close()


class MinibatchSource:
    """Minibatches of a dataset, shuffled in windows of chunks, split across ranks.

    ``source``: a dict of equally long arrays, or a :class:`Source`. Iterating
    gives one epoch (each new ``for`` loop the next epoch, in a new order); every
    rank gets ``len(self)`` minibatches of ``batch_size`` samples, the ranks'
    parts are disjoint and together cover the epoch (``drop_last=False`` pads
    short ranks with marked repeats; ``drop_last=True`` drops the tail).
    :meth:`next_minibatch` reads on across epochs, CNTK style.

    >>> import numpy as np
    >>> data = {'x': np.arange(10).reshape(10, 1), 'y': np.arange(10)}
    >>> src = MinibatchSource(data, batch_size=4, shuffle=False, prefetch=0)
    >>> [mb['y'].tolist() for mb in src]
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]
    >>> [mb.pad for mb in src]
    [0, 0, 2]
    >>> r1 = MinibatchSource(data, batch_size=2, shuffle=False, rank=1, num_workers=2)
    >>> [mb['y'].tolist() for mb in r1]
    [[5, 6], [7, 8], [9, 0]]
    """

    def __init__(
        self,
        source: Mapping[str, Any] | Source,
        batch_size: int = 32,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        num_workers: int | None = None,
        drop_last: bool = False,
        prefetch: int = 2,
        window: int | None = 16,
        to_device: Any = None,
        store: Any = None,
        chunk_size: int | None = None,
    ) -> None:
        if isinstance(source, Mapping):
            source = ArraySource(source, chunk_size=chunk_size)
        elif not isinstance(source, Source):
            raise TypeError(
                "source must be a dict of arrays or a Source (names, chunk_sizes, read_chunk), "
                f"got {type(source).__name__}"
            )
        if store is not None:
            if rank is not None or num_workers is not None:
                raise ValueError("give either store= or rank=/num_workers=, not both")
            rank, num_workers = int(store.rank), int(store.num_workers)
        rank = 0 if rank is None else rank
        num_workers = 1 if num_workers is None else num_workers
        sizes = [int(s) for s in source.chunk_sizes]
        if any(s <= 0 for s in sizes):
            raise ValueError(f"chunk sizes must be positive, got {sizes[:10]}")
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 chunk (or None: all), got {window}")
        if prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {prefetch}")
        self.source = source
        self.partition: Partition = plan_partition(sum(sizes), batch_size, num_workers, drop_last)
        if isinstance(rank, bool) or not 0 <= rank < num_workers:
            raise ValueError(f"rank must be in [0, num_workers={num_workers}), got {rank!r}")
        self.batch_size, self.rank, self.num_workers = batch_size, rank, num_workers
        self.shuffle, self.seed, self.window = shuffle, seed, window
        self.drop_last, self.prefetch, self.to_device = drop_last, prefetch, to_device
        self._chunk_sizes = sizes
        self._reader = Reader(source, self.partition, rank)
        self._epoch = 0
        self._open: weakref.WeakSet = weakref.WeakSet()
        self._stream: Iterator[Minibatch] | None = None
        self._leftover: list[Minibatch] = []

    # -- constructors --------------------------------------------------------

    @classmethod
    def for_store(
        cls, kv: Any, source: Mapping[str, Any] | Source, **kwargs: Any
    ) -> MinibatchSource:
        """This worker's part: ``rank`` and ``num_workers`` come from the store
        (MXNet's ``num_parts=kv.num_workers, part_index=kv.rank``).

        >>> import numpy as np
        >>> from types import SimpleNamespace
        >>> kv = SimpleNamespace(rank=1, num_workers=2)
        >>> MinibatchSource.for_store(kv, {'x': np.arange(8)}, batch_size=2).rank
        1
        """
        return cls(source, store=kv, **kwargs)

    @classmethod
    def from_npy(
        cls,
        paths_by_name: Mapping[str, str | os.PathLike | Sequence[str | os.PathLike]],
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        **kwargs: Any,
    ) -> MinibatchSource:
        """From ``.npy`` files (one per field, or a list of shards), read through memmaps.

        >>> import tempfile, os, numpy as np
        >>> d = tempfile.mkdtemp(); np.save(os.path.join(d, 'y.npy'), np.arange(6))
        >>> src = MinibatchSource.from_npy({'y': os.path.join(d, 'y.npy')}, batch_size=3)
        >>> sorted(np.concatenate([mb['y'] for mb in src]).tolist())
        [0, 1, 2, 3, 4, 5]
        """
        return cls(NpySource(paths_by_name, chunk_bytes=chunk_bytes), **kwargs)

    @classmethod
    def from_ctf(
        cls,
        path: str | os.PathLike,
        streams: Mapping[str, Mapping[str, Any] | int],
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        sequences: bool | None = None,
        **kwargs: Any,
    ) -> MinibatchSource:
        """From a CNTK Text Format file; ``streams`` maps names to ``{'dim': d,
        'sparse': bool, 'field': name in the file, 'dtype': ...}``.

        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), 'd.ctf')
        >>> _ = open(p, 'w').write('|x 1 2 |y 0:1\\n|x 3 4 |y 1:1\\n')
        >>> src = MinibatchSource.from_ctf(p, {'x': {'dim': 2}, 'y': {'dim': 2, 'sparse': True}},
        ...                                batch_size=2, shuffle=False)
        >>> next(iter(src))['y'].tolist()
        [[1.0, 0.0], [0.0, 1.0]]
        """
        return cls(CTFSource(path, streams, chunk_bytes=chunk_bytes, sequences=sequences), **kwargs)

    @classmethod
    def from_dask(cls, arrays_by_name: Mapping[str, Any], **kwargs: Any) -> MinibatchSource:
        """From ``dask.array`` fields; each dask chunk is computed when needed.

        >>> import dask.array as da
        >>> src = MinibatchSource.from_dask({'x': da.arange(6, chunks=2)}, batch_size=3)
        >>> len(src)
        2
        """
        return cls(DaskSource(arrays_by_name), **kwargs)

    # -- facts ---------------------------------------------------------------

    @property
    def names(self) -> tuple[str, ...]:
        """The fields of each minibatch."""
        return tuple(self.source.names)

    @property
    def num_samples(self) -> int:
        """Samples in the whole source (all ranks)."""
        return self.partition.num_samples

    @property
    def epoch(self) -> int:
        """The epoch the next ``for`` loop will read."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``for`` loop read ``epoch`` (e.g. when resuming)."""
        self._epoch = int(epoch)

    def __len__(self) -> int:
        """Minibatches per epoch, the same on every rank."""
        return self.partition.steps

    def order(self, epoch: int) -> EpochOrder:
        """The sample order of ``epoch`` (the same on every rank)."""
        return EpochOrder(self._chunk_sizes, self.window, self.seed, epoch, self.shuffle)

    def __repr__(self) -> str:
        return (
            f"MinibatchSource({type(self.source).__name__}, {self.num_samples} samples, "
            f"batch_size={self.batch_size}, rank {self.rank}/{self.num_workers}, "
            f"{len(self)} steps/epoch, drop_last={self.drop_last})"
        )

    # -- reading -------------------------------------------------------------

    def __iter__(self) -> _EpochIterator:
        epoch = self._epoch
        self._epoch += 1
        return self.iter_epoch(epoch)

    def iter_epoch(self, epoch: int) -> _EpochIterator:
        """The minibatches of ``epoch`` for this rank (does not move :attr:`epoch`)."""
        device = self.to_device

        def produce() -> Iterator[Minibatch]:
            for mb in self._reader.epoch(self.order(epoch)):
                yield finish(mb, device)

        it = _EpochIterator(self._start(produce), len(self))
        self._open.add(it)
        return it

    def _start(self, produce: Any) -> Iterator[Minibatch]:
        if self.prefetch == 0:
            return produce()
        return Prefetcher(produce, depth=self.prefetch)

    def minibatch_at(self, step: int) -> Minibatch:
        """This rank's minibatch of ``step`` (counted over epochs: epoch
        ``step // len(self)``, its ``step % len(self)``-th), the one a ``for``
        loop over that epoch gives, read on its own. For a step loop whose
        steps a lost rank's replacement replays (``for step in kv.steps(n)``:
        ``src.minibatch_at(step.number)``).

        >>> import numpy as np
        >>> src = MinibatchSource({'y': np.arange(10)}, batch_size=4, seed=1, prefetch=0)
        >>> epochs = [mb['y'].tolist() for mb in src] + [mb['y'].tolist() for mb in src]
        >>> [src.minibatch_at(n)['y'].tolist() for n in range(6)] == epochs
        True
        """
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        epoch, index = divmod(int(step), len(self))
        return finish(self._reader.at(self.order(epoch), index), self.to_device)

    def next_minibatch(self, n: int | None = None) -> Minibatch:
        """The next ``n`` samples (default ``batch_size``) of this rank's endless
        stream of epochs (0, 1, 2, ...; independent of ``for`` loops). A minibatch
        may span two epochs; ``sweep_end`` says it holds an epoch's last sample.

        >>> import numpy as np
        >>> src = MinibatchSource({'y': np.arange(4)}, batch_size=2, shuffle=False)
        >>> [src.next_minibatch(3)['y'].tolist() for _ in range(3)]
        [[0, 1, 2], [3, 0, 1], [2, 3, 0]]
        """
        n = self.batch_size if n is None else int(n)
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if self._stream is None:
            epochs = (self.order(e) for e in itertools.count())
            self._stream = self._start(lambda: self._reader.stream(epochs))
        parts, have = [], 0
        while have < n:
            mb = self._leftover.pop(0) if self._leftover else next(self._stream)
            take = min(n - have, mb.num_samples)
            parts.append(mb.slice(0, take))
            if take < mb.num_samples:
                self._leftover.append(mb.slice(take, mb.num_samples))
            have += take
        out = concat(parts)
        out.step = parts[0].step
        return finish(out, self.to_device)

    def close(self) -> None:
        """Stop every prefetch thread this source started."""
        for it in list(self._open):
            it.close()
        if self._stream is not None:
            close = getattr(self._stream, "close", None)
            if close is not None:
                close()
            self._stream, self._leftover = None, []

    def __enter__(self) -> MinibatchSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
