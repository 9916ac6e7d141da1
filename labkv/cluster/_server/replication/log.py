"""Replicated servers, the server side: primary-backup with an ordered log of updates.

With ``replicas=R`` each server id has R replicas on R different Dask workers;
the first is the primary, which the ranks call. The primary applies an update
(a completed dist_sync round, or a dist_async push) as before, then forwards
it to the backups as one log entry ``(index, [(key, merged)], [(sender, key,
seq)])``: the *merged* value of each key (the sum of the round's pushes, in the
stored dtype), which every replica applies with the same ``Shard.apply``, so
values, optimizer states and update counts stay bit-identical. Backups apply
entries strictly in index order (:meth:`Replication.replicate` waits for the
ones before), so the order of updates, and thus the learning-rate schedule
that reads the update count, is the primary's.

Nothing is acknowledged before every live backup has applied it: a round
finishes (its pulls may read it, its ranks may push the next one) only when
its entry is acknowledged, a dist_async pull waits until every entry issued
before it is, and each push or pull reply tells the sender up to which of
its pushes everything is applied everywhere (:meth:`Replication._acked`): a
rank keeps its pushes until then and resends the rest to the next primary
after a failover. Each entry carries the ``(sender, key, seq)`` of the pushes
it holds, so a new primary knows what it already applied and a resend is
applied once (:meth:`Replication._already_applied`).

Changes of the group (promotion after a loss, a new replica, seeding a replica
with the primary's state) are in :mod:`labkv.cluster._server.replication.group`.

A mixin of :class:`~labkv.cluster._server.actor.Server`; a server with ``group is None`` (R = 1)
never reaches this code.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ....devices import to_device
from ..._device import host_view
from ..._errors import answered, deposed, is_deposed
from ..._protocol.messages import Peer, decode_entry, encode_entry
from ..._transport.base import POLL_S
from ..order import UpdateQueue
from ..rounds import Failure, pushed_by
from .group import Membership

Key = int | str


def _host(value: Any) -> Any:
    return None if value is None else host_view(value)


class Replication(Membership):
    """Log entries, their acknowledgement, promotion and seeding (see module doc)."""

    group: list[Peer] | None = None  # the replicas, primary first (None: replicas=1)

    def _start_group(self, members: list[Peer], me: int, seeded: bool = True) -> None:
        self.group = [Peer._make(m) for m in members]
        self.me = Peer._make(members[me])
        self.epoch = 0
        self.issued = 0  # entries applied here (on a backup: the next index it expects)
        self.acked = 0  # primary: entries every live backup has applied
        self.deposed = False  # a backup became the primary: acknowledge nothing more
        self.seeded = seeded  # a new replica waits for its seed before any entry
        self.applied_seq: dict[tuple[str, Key], int] = {}  # (sender, key) -> last seq applied
        self._log: dict[int, tuple[list, Any]] = {}  # index -> (its pushes, then)
        self._acks: set[int] = set()

    @property
    def primary(self) -> bool:
        return self.group is not None and self.group[0] == self.me

    # -- applying an entry (primary and backups alike) ----------------------------------
    def _apply_entry(self, updates: list[tuple[Key, Any]], pushes: list[tuple]) -> None:
        """Apply a log entry's updates (a key with value None: its update failed,
        nothing to apply) and note its pushes as applied. The values are this
        replica's own (they came over a wire, see ``Host.call_peer``): the
        shard may keep them instead of copying them."""
        applied = [(k, [v]) for k, v in updates if v is not None]
        if applied:
            self.shard.apply(applied, owned=True)
        self._note_pushes(pushes)

    def _note_pushes(self, pushes: list[tuple]) -> None:
        for sender, key, seq in pushes:
            if self.applied_seq.get((sender, key), -1) < seq:
                self.applied_seq[(sender, key)] = seq
            if self.next_seq.get(sender, 0) <= seq:
                self.next_seq[sender] = seq + 1

    def _already_applied(self, sender: str, key: Key, seq: int) -> bool:
        """Whether ``sender``'s ``seq``-th push of ``key`` is applied here, or in
        the open round: a resend after a failover must not count twice."""
        if self.applied_seq.get((sender, key), -1) >= seq:
            return True
        return self.sync and self.rounds[key].senders.get(sender) == seq

    # -- the primary: issue, forward, acknowledge -----------------------------------
    def _complete_replicated(self, keys: list[Key], sender: str) -> None:
        """``_complete`` of a replicated server: the rounds of ``keys`` are applied
        here and forwarded; they finish (pulls read them, ranks push the next)
        once every live backup has applied them."""
        rounds = {k: self.rounds[k] for k in keys}
        batch = [(k, [r.pending[q] for q in sorted(r.pending)]) for k, r in rounds.items()]
        try:
            self.shard.apply(batch)
        except Exception as exc:  # the round still ends, so no rank waits forever
            numbers = {k: r.done for k, r in rounds.items()}
            failure = self._failure(exc, keys, pushed_by(keys, rounds), numbers)
            self._replicate_rounds(keys, failure, sender)
            raise failure.report_to(sender) from None
        self._replicate_rounds(keys, None, sender)

    def _replicate_rounds(
        self,
        keys: list[Key],
        failure: Failure | None,
        told: str | None,
        pushes: list[tuple] | None = None,
    ) -> None:
        """Forward the open rounds of ``keys``, applied here (or failed as
        ``failure``, which the backups then owe to every rank but ``told``,
        told now): they finish once every live backup has them (a failed one
        at once: nothing changed). ``pushes``: those the update holds (by
        default, the dist_sync rounds' pushes)."""
        rounds = {k: self.rounds[k] for k in keys}
        if pushes is None:
            pushes = [(s, k, q) for k, r in rounds.items() for s, q in r.senders.items()]
        if failure is not None:
            owed = {s: seqs for s, seqs in failure.untold.items() if s != told}
            self._issue_failed(keys, pushes, ("failed", failure.error, owed))
            for key in keys:
                self._finish(key, failure)
            return
        # The merged values travel by reference: the next round of these keys
        # cannot complete (and change them) before this entry is acknowledged.
        updates = [(k, self.shard.merged(k)) for k in keys]
        self._issue(updates, pushes, lambda: [self._finish(k, None) for k in keys])

    def _issue_push(self, sender: str, seq: int, items: list[tuple[Key, Any]], rank: int) -> None:
        """A dist_async or dist_ssp push of a replicated server: applied here and
        forwarded (its values as they arrived: a backup's ``apply`` of them makes
        the same bits, and nothing changes them before the entry is sent). In
        dist_ssp the entry names the pushing rank, whose clocks of the keys
        every replica advances, failed or not (see ``_clock_entry``)."""
        if not items:
            return  # a resend of what is applied here
        pushes = [(sender, k, seq) for k, _ in items]
        note = None if self.clocks is None else ("clock", rank)
        try:
            self.shard.apply([(k, [v]) for k, v in items])
        except Exception:
            self._issue_failed([k for k, _ in items], pushes, note)
            raise
        self._issue(items, pushes, note=note)

    def _issue_failed(
        self, keys: list[Key], pushes: list[tuple], note: tuple | None = None
    ) -> None:
        """Log an update that failed (its updater raised; nothing changed): the
        backups count its pushes as done and close its rounds, so that a resend
        after a failover does not run it again; a dist_sync round's ``note``
        (see :func:`~labkv.cluster._protocol.messages.encode_entry`) says to which ranks it is still owed."""
        self._issue([(k, None) for k in keys], pushes, note=note)

    def _issue_told(self, sender: str, keys: list[Key]) -> None:
        """Log that ``sender`` was told of the earliest failed round of ``keys``,
        so that a new primary does not tell it again."""
        self._issue([], [], note=("told", sender, keys))

    def _issue(
        self,
        updates: list[tuple[Key, Any]],
        pushes: list[tuple],
        then: Any = None,
        note: tuple | None = None,
    ) -> int:
        """Forward ``updates`` (applied here) to the backups; ``then()`` runs once
        every live backup has applied them (and those before)."""
        self._note_pushes(pushes)
        self._clock_entry(pushes, note)
        index = self.issued
        self.issued += 1
        self._log[index] = (pushes, then)
        backups = self.group[1:]
        if not backups:
            self._entry_acked(index)
        else:
            entry = encode_entry(index, [(k, _host(v)) for k, v in updates], pushes, note)
            task = asyncio.ensure_future(self._forward(backups, entry))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return index

    def _clock_entry(self, pushes: list[tuple], note: tuple | None) -> None:
        """dist_ssp: the pushing rank's clocks of an entry's keys advance (on the
        primary as it issues the entry, on a backup as it applies it)."""
        if note is not None and note[0] == "clock":
            self._ticked(pushes[0][0], note[1], [k for _, k, _ in pushes])

    async def _forward(self, backups: list[Peer], entry: tuple) -> None:
        """Send ``entry`` to every backup, then acknowledge it. A backup that
        cannot apply it is gone and the others carry on; one that has become
        the primary (the ranks took this one for lost) deposes this one, which
        then acknowledges nothing more: its entries, votes included, stay
        unacknowledged, and the ranks resend their pushes to the new primary."""
        if len(backups) == 1:  # the common case, without a task per backup
            outcomes: list = [None]
            try:
                await self._forward_one(backups[0], entry)
            except (Exception, asyncio.CancelledError) as exc:
                outcomes = [exc]
        else:
            calls = [self._forward_one(b, entry) for b in backups]
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
        if any(is_deposed(out) for out in outcomes):
            self.deposed = True
        if self.deposed:
            return
        lost = [b for b, out in zip(backups, outcomes, strict=True) if out is not None]
        if lost:  # a backup that cannot apply an entry is gone: the others carry on
            self.group = [m for m in self.group if m not in lost]
            self.epoch += 1
            if self.bus.active:
                self.bus.emit("failover", None, server=self.sid, extra=self._replica_extra(lost))
        self._entry_acked(entry[0])

    async def _forward_one(self, backup: Peer, entry: tuple) -> None:
        """Send ``entry`` to ``backup``. A call to a dead worker can sit in Dask's
        connect retries for 30 s, so a reply slower than ``POLL_S`` makes the
        primary ask the scheduler whether it still has that worker, and give
        up on it (the call is cancelled) if not."""
        timer = asyncio.get_running_loop().call_later(
            POLL_S, self._watch_backup, backup, asyncio.current_task()
        )
        try:
            await self.host.call_peer(backup, "replicate", [entry])
        finally:
            timer.cancel()

    def _watch_backup(self, backup: Peer, task: asyncio.Task) -> None:
        async def watch() -> None:
            while not task.done():
                if not await self.host.alive(backup.address):
                    task.cancel()
                    return
                await asyncio.sleep(POLL_S)

        watcher = asyncio.ensure_future(watch())
        self._tasks.add(watcher)
        watcher.add_done_callback(self._tasks.discard)

    def _entry_acked(self, index: int) -> None:
        self._acks.add(index)
        while self.acked in self._acks:
            self._acks.discard(self.acked)
            _, then = self._log.pop(self.acked)
            self.acked += 1
            if then is not None:
                then()
        self._wake()

    async def _replicated(self) -> None:
        """Wait until every entry issued so far is applied by every live backup."""
        upto = self.issued
        if self.acked < upto:
            await self._wait(
                lambda: self.acked >= upto,
                lambda: f"backups {self._backup_names()} have not applied update {self.acked}",
            )

    def _acked(self, sender: str) -> int:
        """``sender``'s pushes before this one are applied on every live replica."""
        low = self.next_seq.get(sender, 0)
        for pushes, _ in self._log.values():
            for s, _, seq in pushes:
                if s == sender and seq < low:
                    low = seq
        if self.sync:
            for r in self.rounds.values():
                seq = r.senders.get(sender)
                if seq is not None and seq < low:
                    low = seq
        return low

    def _reply(self, sender: str, payload: Any = None) -> tuple:
        """A replicated server's push or pull reply: ``(acked, epoch, payload)``."""
        return (self._acked(sender), self.epoch, payload)

    def _load(self) -> dict[str, Any]:
        """The server's load (see ``ServerEvents._load``), with its replicas
        (primary first) when it has some: what the monitor's server table reads."""
        load = super()._load()
        if self.group is not None:
            load["replicas"] = [m.address for m in self.group]
            load["primary"] = self.primary
        return load

    def _backup_names(self) -> list[str]:
        return [m.address for m in self.group[1:]]

    def _replica_extra(self, lost: list[Peer]) -> dict[str, Any]:
        """A backup was lost (the primary stays): what the event says."""
        return {
            "replicas": [m.address for m in self.group],
            "primary": self.group[0].address,
            "lost": [m.address for m in lost],
            "promoted": False,
        }

    # -- remote methods ---------------------------------------------------------------
    @answered
    async def replicate(self, entry: tuple) -> None:
        """A backup applies the primary's log entry ``(index, updates, pushes)``
        once every entry before it is applied."""
        index, updates, pushes, note = decode_entry(entry)
        await self._wait(
            lambda: self.primary or (self.seeded and self.issued >= index),
            lambda: f"update {self.issued} from the primary never arrived (got {index})",
        )
        if self.primary:  # promoted (the ranks took the sender for lost): it is deposed
            raise deposed(f"{self.me.actor_key} is the primary now: it takes no entry")
        if index < self.issued:
            return  # already in the state it was seeded with
        # No copy on the host: the entry's values are this replica's own.
        on_device = [
            (k, None if v is None else to_device(v, self.device, copy=False)) for k, v in updates
        ]
        self._apply_entry(on_device, pushes)
        self._clock_entry(pushes, note)
        if self.sync:
            self._note_failures(note, updates)
        elif self.shard.updater is not None:
            self._note_ordered_updates(note, updates, pushes)
        if note is not None and note[0] == "vote":
            self._keep_vote(*note[1:])
        self.issued = index + 1
        self._wake()

    def _note_ordered_updates(
        self, note: tuple | None, updates: list[tuple[Key, Any]], pushes: list[tuple]
    ) -> None:
        """A backup's dist_async sliced keys after an entry: each update is one
        more decided in server 0's order, and numbers its sender's push (as its
        primary's queue did), so a new primary goes on from there."""
        ordered = [(k, v) for k, v in updates if k in self.sliced]
        if not ordered:
            return
        self._note_failures(note, ordered)
        for sender, key, _ in pushes:
            if key in self.sliced:
                self.queues.setdefault(key, UpdateQueue()).applied(sender)

    def _note_failures(self, note: tuple | None, updates: list[tuple[Key, Any]]) -> None:
        """A backup's dist_sync rounds after an entry: each updated key's round
        closes, a failed one owed to the ranks the ``note`` names; a ``told``
        note crosses a failure off for the rank the primary told."""
        failure = None
        if note is not None and note[0] == "failed":
            _, error, owed = note
            failure = Failure(error, self.sid, [k for k, v in updates if v is None], owed)
        for key, value in updates:
            self.rounds[key].finish(failure if value is None else None)
        if note is not None and note[0] == "told":
            _, sender, keys = note
            for key in keys:
                self.rounds[key].report_to(sender)

    @answered
    async def replay(self, sender: str, first_seq: int, pushes: list[Any]) -> tuple:
        """A new primary gets ``sender``'s pushes not yet acknowledged, from its
        ``first_seq``-th on (those before are applied everywhere), in order;
        what is already applied here is skipped. The push reply."""
        if self.next_seq.get(sender, 0) < first_seq:
            self.next_seq[sender] = first_seq
            self._wake()
        for push in pushes:
            await self.push(push)
        await self._replicated()
        return self._reply(sender)
