"""Replicated servers, the server side: primary-backup with an ordered log of
updates (:class:`ReplicaLog`); its no-op twin for ``replicas=1`` is
:class:`~labkv.cluster._server.replication.null.NullLog`, so that a server
without replicas never branches on having them.

With ``replicas=R`` each server id has R replicas on R different Dask workers;
the first is the primary, which the ranks call. The primary applies an update
(a completed dist_sync round, or a dist_async push) as before, then forwards
it to the backups as one log entry (:mod:`labkv.cluster._protocol.entries`):
the *merged* value of each key (the sum of the round's pushes, in the stored
dtype), which every replica applies with the same ``Shard.apply``, so values,
optimizer states and update counts stay bit-identical. Backups apply entries
strictly in index order (:meth:`ReplicaLog.receive` waits for the ones
before), so the order of updates, and thus the learning-rate schedule that
reads the update count, is the primary's.

Nothing is acknowledged before every live backup has applied it: a round
finishes (its pulls may read it, its ranks may push the next one) only when
its entry is acknowledged, a dist_async pull waits until every entry issued
before it is, and each push or pull reply tells the sender up to which of its
pushes everything is applied everywhere (:meth:`ReplicaLog.reply`): a rank
keeps its pushes until then and resends the rest to the next primary after a
failover. Each entry carries the ``(sender, key, seq)`` of the pushes it
holds, so a new primary knows what it already applied and a resend is applied
once (:meth:`ReplicaLog.fresh`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...._types import Key
from ....devices import Device, to_device
from ....events import Event
from ....shard import Shard
from ..._device import host_view
from ..._errors import deposed
from ..._protocol.entries import Clock, Control, Entry, Failed, Passed, Told, Vote, encode_entry
from ..._protocol.messages import Peer
from ..._tasks import TaskGroup
from ..._transport.base import Host
from .forwarder import Forwarder
from .group import Group
from .notes import NoteEffects
from .step_marks import StepMarks, copied

if TYPE_CHECKING:
    from ..._errors import Failure
    from ..._protocol import entries
    from .ports import (
        BarriersPort,
        Finish,
        KeptVotesPort,
        ModePort,
        ReportsPort,
        RoundsPort,
        SenderOrderPort,
        WaitersPort,
    )


#: How soon a primary logs a barrier generation every backup passed on its own.
LATE_PASS_S = 1.0


def _host(value: Any) -> Any:
    return None if value is None else host_view(value)


@dataclass
class LogSnapshot:
    """A replica's log as a new replica takes it: every entry before ``index``
    is in the snapshot, every one from it on is forwarded to the new one."""

    index: int
    members: list[tuple[str, str]]
    epoch: int
    applied_seq: dict[tuple[str, Key], int]


class ReplicaLog:
    """The log of a replicated server, as ``group`` sees it (see module doc);
    ``seeded=False``: a new replica, which takes no entry before its seed."""

    def __init__(
        self,
        group: Group,
        seeded: bool,
        device: Device,
        shard: Shard,
        rounds: RoundsPort,
        senders: SenderOrderPort,
        effects: NoteEffects,
        kept: KeptVotesPort,
        waiting: WaitersPort,
        host: Host,
        tasks: TaskGroup,
        reports: ReportsPort,
        marks: StepMarks,
    ) -> None:
        self.group, self.seeded, self.marks = group, seeded, marks
        self.device, self.shard, self.rounds = device, shard, rounds
        self.senders, self.effects, self.kept = senders, effects, kept
        self.waiting, self.host, self.tasks, self.reports = waiting, host, tasks, reports
        self.issued = 0  # entries applied here (on a backup: the next index it expects)
        self.acked = 0  # primary: entries every live backup has applied
        self.forwarder = Forwarder(group, host, tasks, reports, self._entry_acked, self.regrouped)
        self.applied_seq: dict[tuple[str, Key], int] = {}  # (sender, key) -> last seq applied
        self._log: dict[int, tuple[list, Callable[[], Any] | None]] = {}  # index -> (pushes, then)
        self._acks: set[int] = set()
        self._late_passes: dict[str, Any] = {}  # group -> generation (see barrier_passed)

    @property
    def primary(self) -> bool:
        return self.group.primary

    @property
    def deposed(self) -> bool:
        """A backup became the primary: this one acknowledges nothing more."""
        return self.forwarder.deposed

    @property
    def me(self) -> Peer:
        return self.group.me

    @property
    def backups(self) -> list[Peer]:
        return self.group.backups

    # -- what pushes, pulls and updates do with the log ----------------------------------
    def fresh(self, sender: str, seq: int, items: list, mode: ModePort) -> list:
        """``items`` of ``sender``'s ``seq``-th push not applied here yet (nor in
        an open round): a resend after a failover must not count twice."""
        applied = self.applied_seq
        items = [(k, v) for k, v in items if applied.get((sender, k), -1) < seq]
        return mode.outside_open_rounds(sender, seq, items)

    def issue_push(
        self, sender: str, seq: int, items: list, note: Clock | None, marks: list | None = None
    ) -> None:
        """A dist_async or dist_ssp push: applied here and forwarded (its values
        as they arrived: a backup's ``apply`` of them makes the same bits, and
        nothing changes them before the entry is sent), failed or not;
        ``marks``: its step marks (see :mod:`.steps`)."""
        if not items:
            return  # a resend of what is applied here
        pushes = [(sender, k, seq) for k, _ in items]
        try:
            self.shard.apply([(k, [v]) for k, v in items])
        except Exception:
            self.issue([(k, None) for k, _ in items], pushes, note=note, marks=marks)
            raise
        else:
            self.issue(items, pushes, note=note, marks=marks)
        finally:
            self.effects.apply(note, [], pushes)

    def after_push(self, note: Clock, sender: str, seq: int, keys: list[Key]) -> None:
        """The push's entry carried its note (applied as it was issued, here
        and on every backup); a push that issued none changes no clock."""

    def rounds_done(
        self,
        keys: list[Key],
        failure: Failure | None,
        told: str | None,
        pushes: list[tuple] | None,
        finish: Finish,
    ) -> None:
        """Forward the open rounds of ``keys``, applied here (or failed as
        ``failure``, which the backups then owe to every rank but ``told``,
        told now): ``finish`` each once every live backup has them (a failed
        one at once: nothing changed). ``pushes``: those the update holds (by
        default, the dist_sync rounds' pushes)."""
        if pushes is None:
            pushes = [(s, k, q) for k in keys for s, q in self.rounds[k].senders.items()]
        marks = self._round_marks(keys) if self.marks else None
        if failure is not None:
            owed = {s: seqs for s, seqs in failure.untold.items() if s != told}
            note = Failed(failure.error, owed)
            self.issue([(k, None) for k in keys], pushes, note=note, marks=marks)
            for key in keys:
                finish(key, failure)
            return
        # The merged values travel by reference: the next round of these keys
        # cannot complete (and change them) before this entry is acknowledged.
        updates = [(k, self.shard.merged(k)) for k in keys]
        for key in keys:  # a replica seeded before the acknowledgement has these rounds
            self.rounds[key].issued = True
        self.issue(updates, pushes, lambda: [finish(k, None) for k in keys], marks=marks)

    def _round_marks(self, keys: list[Key]) -> list[tuple]:
        """The step marks of the pushes in the open rounds of ``keys``."""
        last, digests, found = self.marks.last, self.marks.digests, []
        for key in keys:
            number = self.rounds[key].done
            for rank in self.rounds[key].pending:
                seen = last.get((key, rank))
                if seen is not None and seen[1] == number:
                    found.append((key, rank, *seen, digests.get((key, rank), b"")))
        return found

    def vote(self, vote: Vote, send: Callable[[], None]) -> None:
        """Keep this server's ``vote`` and ``send`` it once every backup has it."""
        self.kept.keep(vote)
        self.issue([], [], then=send, note=vote)

    def told(self, sender: str, keys: list[Key]) -> None:
        """Log that ``sender`` was told of the earliest failed round of ``keys``,
        so that a new primary does not tell it again."""
        self.issue([], [], note=Told(sender, keys))

    def barrier_passed(self, group: str, generation: Any, barriers: BarriersPort) -> None:
        """Log that a barrier generation passed here (a primary's backups release
        its waiters even without every arrival: see ``Barriers.passed_on_primary``):
        at once when a backup may lack an arrival, else (each backup passes it
        on its own, see ``Barriers.told_everyone``) within :data:`LATE_PASS_S`,
        the last one passed of the group: a notice lost in a broken stream then
        costs a new primary no wait."""
        if not self.primary:
            return
        told = {b.actor_key for b in self.backups}
        if not barriers.told_everyone(group, generation, told):
            self.issue([], [], note=Passed(group, generation))
            return
        if not self._late_passes:
            self.tasks.spawn(self._log_late_passes(), quiet=True)
        self._late_passes[group] = generation

    async def _log_late_passes(self) -> None:
        await asyncio.sleep(LATE_PASS_S)
        passes, self._late_passes = self._late_passes, {}
        if self.primary and not self.deposed:
            for group, generation in passes.items():
                self.issue([], [], note=Passed(group, generation))

    async def control(self, method: str, *args: Any) -> None:
        """The primary took the control call ``method(*args)``: log it for every
        backup, and wait until they all have it."""
        if self.primary:
            self.issue([], [], note=Control(method, args))
        await self.replicated()

    def regrouped(self) -> None:
        """Log the group as this primary sees it now (a replica dropped or
        seeded), so that its backups' view of it, and its epoch, are the
        primary's: a backup answers near reads only as one of exactly two."""
        if self.primary and self.group.backups:
            epoch, members = self.group.listed()
            self.issue([], [], note=Control("group", (members, epoch)))

    async def replicated(self) -> None:
        """Wait until every entry issued so far is applied by every live backup."""
        upto = self.issued
        if self.acked < upto:
            await self.waiting.until(
                lambda: self.acked >= upto,
                lambda: (
                    f"backups {[m.address for m in self.backups]} have not applied "
                    f"update {self.acked}"
                ),
            )

    def reply(self, sender: str, payload: Any, mode: ModePort) -> tuple:
        """A push or pull reply: ``(acked, epoch, payload)``, ``acked`` the seq up
        to which ``sender``'s pushes are applied on every live replica."""
        low = self.senders.next(sender)
        for pushes, _ in self._log.values():
            for s, _, seq in pushes:
                if s == sender and seq < low:
                    low = seq
        return (mode.lowest_open(sender, low), self.group.epoch, payload)

    def load(self) -> dict[str, Any]:
        """What the monitor's server table reads: the replicas, primary first, and
        which one this is (a backup's counters are those of the near reads it answered)."""
        members = [m.address for m in self.group.members]
        return {"replicas": members, "primary": self.primary, "address": self.me.address}

    def streams(self, event: Event) -> bool:
        """Whether this replica streams ``event`` while watched: a primary, every
        one; a backup, those of the near reads it answers (a dist_ssp pull's
        clocks, and its counters), as the rest is its primary's to tell."""
        return self.primary or event.op in ("clock", "load")

    # -- the primary: issue, forward, acknowledge -------------------------------------------
    def issue(
        self,
        updates: list[tuple[Key, Any]],
        pushes: list[tuple],
        then: Callable[[], Any] | None = None,
        note: entries.Note | None = None,
        marks: list | None = None,
    ) -> int:
        """Forward ``updates`` (applied here) to the backups; ``then()`` runs once
        every live backup has applied them (and those before)."""
        self._note_pushes(pushes)
        index = self.issued
        self.issued += 1
        self._log[index] = (pushes, then)
        backups = self.group.backups
        if not backups:
            self._entry_acked(index)
        else:
            updates = [(k, _host(v)) for k, v in updates]
            self.forwarder.send(backups, encode_entry(index, updates, pushes, note, marks))
        return index

    def _note_pushes(self, pushes: list[tuple]) -> None:
        for sender, key, seq in pushes:
            if self.applied_seq.get((sender, key), -1) < seq:
                self.applied_seq[(sender, key)] = seq

    def _entry_acked(self, index: int) -> None:
        self._acks.add(index)
        while self.acked in self._acks:
            self._acks.discard(self.acked)
            _, then = self._log.pop(self.acked)
            self.acked += 1
            if then is not None:
                then()
        self.waiting.wake()

    # -- a backup: the primary's entries in order -----------------------------------------------
    async def receive(self, index: int) -> bool:
        """Wait until every entry before the ``index``-th is applied here; whether
        that one is new (not in the state this replica was seeded with)."""
        await self.waiting.until(
            lambda: self.primary or (self.seeded and self.issued >= index),
            lambda: f"update {self.issued} from the primary never arrived (got {index})",
        )
        if self.primary:  # promoted (the ranks took the sender for lost): it is deposed
            raise deposed(f"{self.me.actor_key} is the primary now: it takes no entry")
        return index >= self.issued

    def apply(self, entry: Entry) -> Failure | None:
        """Apply ``entry`` (a key with value None: its update failed, nothing to
        apply), note its pushes as applied and apply its note; the failure the
        note describes. No copy: the values came over a wire (see
        ``Host.call_peer``), the shard may keep them."""
        applied = [
            (k, [to_device(v, self.device, copy=False)]) for k, v in entry.updates if v is not None
        ]
        if entry.marks:
            self._take_marks(entry)
        if applied:
            self.shard.apply(applied, owned=True)
        self._note_pushes(entry.pushes)
        for sender, _, seq in entry.pushes:
            # Here, not as the primary issues: there a push also waits for its
            # sliced keys' updates (``Server.push`` passes it when it is over),
            # and a pull must not read past them.
            self.senders.passed(sender, seq)
        return self.effects.apply(entry.note, entry.updates, entry.pushes)

    def _take_marks(self, entry: Entry) -> None:
        """The entry's step marks; a dist_sync round's (numbered) keeps its key's
        value before the round, as the primary did."""
        kept = set()
        for key, rank, step, number, sha in entry.marks:
            if number >= 0 and key not in kept:
                kept.add(key)
                self.marks.keep_before(key, number, copied(self.shard.read(key)))
            self.marks.mark(key, rank, step, number, sha=sha)

    def applied(self, index: int) -> None:
        """The ``index``-th entry is applied here: the next may come."""
        self.issued = index + 1
        self.waiting.wake()

    # -- the group's changes ------------------------------------------------------------------
    def members(self) -> tuple[int, list[tuple[str, str]]]:
        return self.group.listed()

    def promote(self, lost: list[tuple[str, str]]) -> bool:
        """Become the primary, the replicas in ``lost`` gone; whether this
        replica became the primary now (it may be already)."""
        if self.primary:
            return False
        self.group.take_over({Peer._make(p) for p in lost})
        self.acked = self.issued
        self.waiting.wake()  # an entry of the old primary waiting here is refused now
        return True

    def snapshot(self) -> LogSnapshot:
        members = [tuple(m) for m in self.group.members]
        return LogSnapshot(self.issued, members, self.group.epoch, dict(self.applied_seq))

    def restore(self, snap: LogSnapshot) -> None:
        """Start over from a primary's snapshot: every entry before its index applied."""
        self.group.rejoin(snap.members, snap.epoch)
        self.issued = self.acked = snap.index
        self.forwarder.deposed, self.seeded = False, True
        self.applied_seq = dict(snap.applied_seq)
        self._log, self._acks = {}, set()
