"""The distributed store on Dask: server shards on Dask workers.

- :func:`connect`: an embedded ``LocalCluster`` or a running scheduler; a
  node that cannot run what a store or a run needs is a
  :class:`ClusterMismatchError` (a :class:`ClusterError`) naming it.
- ``labkv.create('dist_sync', cluster=handle)``: a store whose keys live on
  server actors; in a notebook the kernel is rank 0 of 1.
- :func:`run`: ``fn(kv)`` as W ranks, one pinned Dask task per worker;
  ``for step in kv.steps(n)`` (each a :class:`Step`) lets ``run`` replace a
  rank lost mid-run (``on_rank_loss="replace"``).

See ``docs/cluster.md`` for how to use it, ``docs/design.md`` for its map and
every scheduling choice, ``docs/performance.md`` for the measurements.
"""

from __future__ import annotations

from ._errors import ClusterError
from ._placement import key_id, place
from ._rank.dist_store import DistStore
from ._rank.steps import Step
from ._runtime.compat import ClusterMismatchError
from ._runtime.connect import ClusterHandle, connect, default_handle
from ._runtime.links import create_store
from ._runtime.run import run

__all__ = [
    "ClusterError",
    "ClusterHandle",
    "ClusterMismatchError",
    "DistStore",
    "Step",
    "connect",
    "create_store",
    "default_handle",
    "key_id",
    "place",
    "run",
]
