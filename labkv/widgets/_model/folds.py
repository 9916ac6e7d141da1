"""Two of the monitor model's folds: a dist rank's rows of row-sparse pushes, and
the reports a failover lost (the model's counts become a lower bound).

>>> from labkv.events import Event
>>> lost: dict = {}
>>> fold_failover(lost, Event(0, 1.0, "dist_sync", "failover", None, server=0,
...     extra={"lost": ["tcp://a:1"], "replicas": ["tcp://b:2"], "promoted": True}))
>>> lost
{0: ['tcp://a:1']}
"""

from __future__ import annotations

from typing import Any

from ..._types import Key
from ...events import Event
from .records import KeyStats

__all__ = ["fold_failover", "fold_rows"]


def fold_rows(keys: dict[Key, KeyStats], e: Event) -> None:
    """The rows of a dist rank's pushes (its servers' receipts count the calls)."""
    moved = e.extra["rows"]
    if e.key is not None:
        stats = keys.get(e.key)
        if stats is not None:
            stats.rows_in += moved
            stats.sparse = stats.sparse or "stype" in e.extra
        return
    for key, rows in zip(e.extra["keys"], moved):
        stats = keys.get(key)
        if stats is not None:
            stats.rows_in += rows


def fold_failover(lost: dict[Any, list[str]], e: Event) -> None:
    """A ``failover`` that promoted a backup: the lost primary's reports of the
    calls it applied in its last ~0.1 s (its events go out in batches) died with
    it, so its server's push and updater counts are a lower bound from now on.
    A lost backup reported nothing (only primaries stream): no loss. Each rank
    of a run reports the same failover; its primary is kept once."""
    if not e.extra.get("promoted") or e.server is None:
        return
    primaries = lost.setdefault(e.server, [])
    for address in e.extra.get("lost", ()):
        if address not in primaries:
            primaries.append(address)
