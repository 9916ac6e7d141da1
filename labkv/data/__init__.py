"""Minibatch sources: large datasets read incrementally, shuffled in windows of
chunks, and split across ranks so that every rank takes the same number of
steps (see ``docs/data.md``).

>>> import numpy as np
>>> from labkv.data import MinibatchSource
>>> data = {'features': np.random.rand(100, 3), 'labels': np.arange(100)}
>>> parts = [MinibatchSource(data, batch_size=8, rank=r, num_workers=3) for r in range(3)]
>>> [len(p) for p in parts]
[5, 5, 5]
>>> seen = np.concatenate([mb.indices[~mb.padding] for p in parts for mb in p])
>>> sorted(seen.tolist()) == list(range(100))
True
"""

from ._batch import Minibatch
from ._ctf import CTFFormatError, CTFSource, StreamSpec
from ._epoch_order import EpochOrder
from ._minibatch import MinibatchSource
from ._partition import Partition, plan_partition
from ._prefetch import Prefetcher
from ._sources import ArraySource, DaskSource, NpySource, Source

__all__ = [
    "MinibatchSource",
    "Minibatch",
    "Source",
    "ArraySource",
    "NpySource",
    "DaskSource",
    "CTFSource",
    "CTFFormatError",
    "StreamSpec",
    "EpochOrder",
    "Partition",
    "plan_partition",
    "Prefetcher",
]
