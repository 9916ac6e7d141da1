"""A backup's reads: a pull of a rank on the backup's own worker.

With two replicas, an update the backup applied is on both (the primary
applies it before it issues the entry). So once the backup applied the
update (a dist_sync round, a dist_async or dist_ssp push) of the rank's last
push of each pulled key, it answers the pull with values the primary could
return after the backup acknowledged that update; a failover then changes no
number the rank read. The primary's reply and the backup's acknowledgement
are off the rank's way (see :mod:`labkv.cluster._rank.failover`). In
dist_async the backup may not have applied yet what other ranks pushed
since, as the primary might not have when the pull reached it: a dist_async
pull waits for the rank's own pushes only. A dist_ssp pull then also waits
until every rank is within the staleness bound by this replica's clocks,
which tick as it applies the log (so they never run ahead of the values it
holds): the bound holds of what it returns, as on the primary.

A rank names, per key, the sequence number of its last push of it; the entry
of that push's update notes it as applied (``ReplicaLog.applied_seq``). A
backup that cannot answer (not seeded; or one of more than two replicas:
the third may lack what this one applied) answers None, and the rank asks
the primary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...._types import Key
from .replica_log import ReplicaLog

if TYPE_CHECKING:
    from .ports import ServerPort


def can_read(server: ServerPort) -> bool:
    """Whether ``server`` answers a near read (see module doc)."""
    log = server.log
    return isinstance(log, ReplicaLog) and log.seeded and len(log.group.members) == 2


async def read_here(
    server: ServerPort, sender: str, rank: int | None, keys: list[Key], seqs: list[int], rows: Any
) -> tuple:
    """``(None, epoch, values)`` of ``keys`` once the updates of ``sender``'s pushes
    ``seqs`` of them are applied here (``rows``: as a pull's); ``(None, None, None)``:
    ask the primary."""
    server.fences.check(sender, rank)
    if not can_read(server):
        return (None, None, None)  # and nothing of the group: it may not be seeded yet
    log: ReplicaLog = server.log  # type: ignore[assignment]
    applied = log.applied_seq

    def waiting_for() -> list[tuple[Key, int]]:
        return [(k, q) for k, q in zip(keys, seqs, strict=True) if applied.get((sender, k), -1) < q]

    def missing() -> str:
        key, seq = waiting_for()[0]
        return (
            f"the update of push #{seq} of key {key!r} by rank {rank} is not applied on this "
            f"replica: its primary on {log.group.members[0].address} has not forwarded it"
        )

    await server.waiting.until(lambda: not waiting_for(), missing)
    if server.clocks is not None:  # dist_ssp: every rank within the bound, by these clocks
        await server.mode.readable(sender, keys, rank)
    for key in keys:
        failed = server.rounds[key].report_to(sender)
        if failed is not None:
            if log.primary:  # promoted while it waited: no replica tells it again
                log.told(sender, [key])
            raise failed
    if log.primary:  # promoted while it waited: its own backups first
        await log.replicated()
    server.reports.messages["pull"] += 1
    # A big dist_sync value goes without a copy, as the primary's own-round reads do (no
    # entry changes it before this rank pushes again); another rank's dist_async push may.
    own = set(keys) if server.mode.sync else set()
    return (None, log.group.epoch, server.mode.values(keys, own, None, rows))
