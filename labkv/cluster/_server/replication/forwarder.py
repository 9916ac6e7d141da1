"""Replicated servers, how a primary's log entries reach its backups
(:class:`Forwarder`, for :class:`~.replica_log.ReplicaLog`): each entry goes to every
live backup, and is acknowledged once each of them applied it or is gone.
A backup that has become the primary deposes this one, which then
acknowledges nothing more.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..._errors import is_deposed
from ..._protocol.messages import Peer
from ..._tasks import TaskGroup
from ..._transport.base import POLL_S, Host
from .group import Group

if TYPE_CHECKING:
    from .ports import ReportsPort


class Forwarder:
    """Sends a primary's entries to ``group``'s backups; ``acked(index)`` once
    the ``index``-th is applied by every live backup."""

    def __init__(
        self,
        group: Group,
        host: Host,
        tasks: TaskGroup,
        reports: ReportsPort,
        acked: Callable[[int], None],
        regrouped: Callable[[], None],
    ) -> None:
        self.group, self.host, self.tasks, self.reports = group, host, tasks, reports
        self.acked, self.regrouped = acked, regrouped
        self.deposed = False  # a backup became the primary: acknowledge nothing more

    def send(self, backups: list[Peer], entry: tuple) -> None:
        """Forward ``entry`` (``encode_entry``'s, its index first) to ``backups``:
        written to each now, acknowledged from its replies' callback, with no
        task (a round's pulls wait for that acknowledgement)."""
        replies = [self._start(b, entry) for b in backups]
        # one backup (the common case): its reply itself, not a gather one loop turn later
        done = replies[0] if len(replies) == 1 else asyncio.gather(*replies, return_exceptions=True)
        done.add_done_callback(
            lambda _: self._forwarded(backups, [_outcome(r) for r in replies], entry[0])
        )

    def _start(self, backup: Peer, entry: tuple) -> asyncio.Future:
        """The call that sends ``entry`` to ``backup``. A call to a dead worker can
        sit in Dask's connect retries for 30 s, so a reply slower than ``POLL_S``
        makes the primary ask the scheduler whether it still has that worker, and
        give up on it (the call is cancelled) if not."""
        loop = asyncio.get_running_loop()
        try:
            reply = self.tasks.spawn(self.host.call_peer(backup, "replicate", [entry]))
        except Exception as exc:  # known dead at once (in-process): a call that failed
            reply = loop.create_future()
            reply.set_exception(exc)
        timer = loop.call_later(POLL_S, self._watch_backup, backup, reply)
        reply.add_done_callback(lambda _: timer.cancel())
        return reply

    def _forwarded(self, backups: list[Peer], outcomes: list, index: int) -> None:
        """The ``index``-th entry reached ``backups`` with ``outcomes`` (None:
        applied). A backup that cannot apply it is gone and the others carry on;
        one that has become the primary (the ranks took this one for lost)
        deposes this one, which then acknowledges nothing more: its entries,
        votes included, stay unacknowledged, and the ranks resend their pushes
        to the new primary."""
        if any(is_deposed(out) for out in outcomes):
            self.deposed = True
        if self.deposed:
            return
        lost = [b for b, out in zip(backups, outcomes, strict=True) if out is not None]
        if lost:  # a backup that cannot apply an entry is gone: the others carry on
            self.group.drop(lost)
            self.reports.backup_lost(lost, self.group.members)
            self.regrouped()  # the others learn it
        self.acked(index)

    def _watch_backup(self, backup: Peer, task: asyncio.Future) -> None:
        async def watch() -> None:
            while not task.done():
                if not await self.host.alive(backup.address):
                    task.cancel()
                    return
                await asyncio.sleep(POLL_S)

        self.tasks.spawn(watch())


def _outcome(reply: asyncio.Future) -> BaseException | None:
    """What a finished call to a backup says: None, it applied the entry."""
    return asyncio.CancelledError() if reply.cancelled() else reply.exception()
