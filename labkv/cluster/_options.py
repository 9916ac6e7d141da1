"""What a store is made of, and every check of its arguments.

- :class:`StoreSpec`: what a rank needs to reach a store's servers.
- :func:`check_staleness`, :func:`check_replicas`: the checks made before
  anything starts, shared by ``create_store`` and ``run``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from .._types import SYNC_KINDS
from ._placement import DEFAULT_BIGARRAY_BOUND


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


DEFAULT_TIMEOUT_S = 120.0


@dataclass
class StoreSpec:
    """What a rank needs to reach a store's servers (picklable; the actor
    handles travel separately, as task arguments Dask tracks)."""

    kind: str
    store_id: str
    num_servers: int
    server_addresses: list[str]
    bigarray_bound: int = DEFAULT_BIGARRAY_BOUND
    timeout: float = DEFAULT_TIMEOUT_S
    group: str = field(default_factory=lambda: f"labkv-barrier-{uuid.uuid4().hex[:8]}")
    #: each server's device, as its placement shows it (``'cpu(0)'``, ``'gpu(0)'``)
    server_devices: list[str] = field(default_factory=list)
    #: the type name the store was made with (``kv.type``; e.g. MXNet's ``'dist'``)
    name: str = ""
    #: dist_ssp: how many rounds a rank may run ahead of the slowest (None otherwise)
    staleness: int | None = None
    #: how many replicas each server has (on different workers; see _replication)
    replicas: int = 1
    #: per server id, its replicas as ``(worker address, actor key)``, primary first
    replica_members: list = field(default_factory=list)
    #: the run's seed: ``kv.steps``'s generators are seeded by (seed, rank, step)
    seed: int = 0
    #: how much longer than ``timeout`` a rank waits for a server's answer: the
    #: servers hold their waits that long while a lost rank is replaced
    #: (``run``'s ``replace_timeout`` with ``on_rank_loss="replace"``)
    replace_hold: float = 0.0

    @property
    def sync(self) -> bool:
        return self.kind in SYNC_KINDS


def check_replicas(replicas: Any) -> int:
    """``replicas`` checked: a positive int."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be a positive int, got {replicas!r}")
    return replicas
