"""How a server turns pushes into updates: a completed dist_sync round or a
dist_async push of a sliced key, applied at once or prepared and voted on.

A sliced key's update commits on every server or none, so with a custom
updater (which may fail on one slice) each server prepares its slice and
tells the others whether it succeeded (:meth:`Updates._vote`); every server
commits when all slices succeeded. In dist_async the servers also apply a
sliced key's updates in one order: the order in which server 0 received them
(:class:`~labkv.cluster._server.order.UpdateQueue`). Plain updates (whole keys, or no custom
updater) are applied at once.

With replicas the primaries vote, each vote logged to the backups before it is
sent (server 0's names the push it placed, so a new server-0 primary keeps its
old primary's order); a primary replicates its slice's update once the vote is
decided, and a new primary tells the other servers where it is
(:meth:`Updates.peer_promoted`) and sends them its recent votes again, and
they send it theirs: a vote sent to or from a dead primary is lost with it.
A mixin of :class:`~labkv.cluster._server.actor.Server`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .._errors import add_note, answered, portable
from .._protocol.messages import Peer
from .order import UpdateQueue
from .rounds import Failure, failure_note, pushed_by

Key = int | str


def _forget(task: asyncio.Future) -> None:
    """Done-callback of a call not waited for: its error (a lost peer) is seen
    as the update that times out naming that peer, so it is only retrieved here."""
    if not task.cancelled():
        task.exception()


class Updates:
    """Applying, preparing and voting on updates (see module doc)."""

    def _failure(
        self, exc: BaseException, keys: list[Key], senders: dict, rounds: dict | None = None
    ) -> Failure:
        """The failure of an update of ``keys``: the updater's own exception,
        noted with where it was raised, owed to ``senders``."""
        add_note(exc, failure_note(self.sid, keys, rounds))
        return Failure(portable(exc), self.sid, keys, senders)

    def _complete(self, keys: list[Key], sender: str) -> None:
        """Apply the rounds of ``keys`` (all ranks pushed) in one ``Shard.apply``.

        The update of a sliced key with a custom updater is only prepared here:
        it commits when every server of the key has prepared its slice (see
        :meth:`_vote`). If the update fails, the completing push (``sender``'s)
        gets the error now and the other ranks at their next pull of the keys."""
        deferred = [k for k in keys if k in self.sliced and self.shard.updater is not None]
        if self.group is not None and not deferred:
            return self._complete_replicated(keys, sender)
        rounds = {k: self.rounds[k] for k in keys}
        batch = [(k, [rounds[k].pending[q] for q in sorted(rounds[k].pending)]) for k in keys]
        prepared, failure = None, None
        try:
            if deferred:
                prepared = self.shard.prepare(batch)
            else:
                self.shard.apply(batch)
        except Exception as exc:  # the round still ends, so no rank waits forever
            numbers = {k: r.done for k, r in rounds.items()}
            failure = self._failure(exc, keys, pushed_by(keys, rounds), numbers)
        now = [k for k in keys if k not in deferred]
        if prepared is not None and now:
            self.shard.commit({k: prepared[k] for k in now})
        if self.group is None:
            for key in now:
                self._finish(key, failure)
        elif now:  # finished once every backup has them
            self._replicate_rounds(now, failure, sender)
        for key in deferred:
            m = rounds[key].done
            candidate = None if prepared is None else prepared[key]
            self._prepared[(key, m)] = (candidate, failure, pushed_by([key], rounds))
            self._vote(key, m, None if failure is None else failure.error)
        if failure is not None and now:
            raise failure.report_to(sender)

    def _finish(self, key: Key, failure: Failure | None) -> None:
        r = self.rounds[key]
        self._votes.pop((key, r.done), None)  # a vote sent again after the decision
        if self.bus.active and self.sync:
            self._emit_round(key, r, completed=r.done)
        r.finish(failure)
        self._wake()
        if not self.sync and key in self.queues:
            self._advance(key)  # the key's next update in server 0's order

    def _missing_votes(self, key: Key) -> str:
        number = self.rounds[key].done
        voted = self._votes.get((key, number), {})
        if (key, number) in self._prepared:
            voted = {**voted, self.sid: None}
        late = [p for p in range(len(self.peers)) if p not in voted]
        return f"servers {late} have not reported their slice of update {number} of key {key!r}"

    def _queue_update(self, sender: str, seq: int, key: Key, value: Any) -> None:
        """Queue ``sender``'s push of a sliced key (a copy: the message's buffer is
        not ours to keep) and apply what is next in server 0's order.

        With a custom updater, a sliced key's update commits on all its slices or
        none, so every server applies the key's updates in one order: the order in
        which server 0 received the pushes (it queues every key of a message at
        once, so its orders of all keys agree), told with its votes. A push
        returns once its updates are decided; no wait can form a cycle, since
        every server decides in server 0's single order of messages."""
        self.queues.setdefault(key, UpdateQueue()).arrive(sender, value.copy(), seq, self.sid == 0)
        self._advance(key)

    def _advance(self, key: Key) -> None:
        """Prepare the next update of ``key`` in order, if it is here, and vote on it."""
        number = self.rounds[key].done
        taken = self.queues[key].take(number)
        if taken is None:
            return
        (sender, n), value, seq = taken
        senders = {sender: {key: seq}}
        candidate, failure = None, None
        try:
            candidate = self.shard.prepare([(key, [value])])[key]
        except Exception as exc:
            failure = self._failure(exc, [key], senders)
        self._prepared[(key, number)] = (candidate, failure, senders)
        self._vote(key, number, None if failure is None else failure.error, (sender, n))

    async def _updates_decided(self, sender: str, keys: list[Key]) -> None:
        """Wait until ``sender``'s queued updates of ``keys`` are decided; raise
        the first that failed (reported to ``sender`` once)."""
        for key in keys:
            q = self.queues[key]
            await self._wait(
                lambda q=q: not q.undecided.get(sender, 0), lambda k=key: self._missing_votes(k)
            )
        for key in keys:
            failed = self.rounds[key].report_to(sender)
            if failed is not None:
                raise failed

    def _vote(
        self, key: Key, number: int, error: BaseException | None, push: tuple | None = None
    ) -> None:
        """Tell every server of the store whether this server's slice of update
        ``number`` of ``key`` (a dist_sync round, or the ``number``-th dist_async
        update, ``push``) succeeded (``error`` None), then decide. Replicated:
        the vote is sent once every backup has it (see module doc)."""
        if self.group is None:
            self._send_vote(key, number, error, push)
        else:
            self._keep_vote(key, number, error, push)
            self._issue(
                [],
                [],
                then=lambda: self._send_vote(key, number, error, push),
                note=("vote", key, number, error, push),
            )
        self._record_vote(key, number, self.sid, error)

    def _send_vote(
        self, key: Key, number: int, error: BaseException | None, push: tuple | None
    ) -> None:
        for peer in range(len(self.peers)):
            if peer != self.sid:
                self._send(peer, "vote", key, number, self.sid, error, push)

    def _keep_vote(
        self, key: Key, number: int, error: BaseException | None, push: tuple | None
    ) -> None:
        """This server's votes of the last two updates of ``key`` (a replica
        keeps its primary's), sent again to a new primary of a peer."""
        mine = self._my_votes.setdefault(key, {})
        mine[number] = (error, push)
        for old in [n for n in mine if n < number - 1]:
            del mine[old]

    def _send_votes_again(self, peer: int) -> None:
        for key, mine in self._my_votes.items():
            for number, (error, push) in mine.items():
                self._send(peer, "vote", key, number, self.sid, error, push)

    def _send(self, peer: int | Peer, method: str, *args: Any) -> None:
        """Call ``method`` of server ``peer`` (its id, or a replica) without
        waiting (a vote never blocks the loop; a lost peer shows as an update
        that times out naming it)."""
        to = self.peers[peer] if isinstance(peer, int) else peer
        try:
            call = self.host.call_peer(to, method, list(args))
        except OSError:  # known dead at once (in-process): as a call that failed
            return
        task = asyncio.ensure_future(call)
        self._tasks.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_forget)

    def _announce_promotion(self) -> None:
        """A new primary tells the other servers of the store where it is and
        sends them its recent votes again; server 0's in dist_async also places
        its old primary's pushes where that one told the others."""
        if not self.peers:
            return
        self.peers[self.sid] = self.me
        if not self.sync and self.sid == 0:
            for key in self.sliced:
                mine = self._my_votes.get(key, {})
                told = {n: push for n, (_, push) in mine.items() if push is not None}
                self.queues.setdefault(key, UpdateQueue()).resume(self.rounds[key].done, told)
        for peer in range(len(self.peers)):
            if peer != self.sid:
                self._send(peer, "peer_promoted", self.sid, tuple(self.me))
                self._send_votes_again(peer)

    @answered
    async def peer_promoted(self, sid: int, peer: tuple[str, str]) -> None:
        """Server ``sid``'s new primary is ``peer``: votes go there from now on
        (this server's backups learn it too), and it gets again this server's
        votes of the last two rounds of each key (it may have missed them, and
        lacks at most the round its old primary was deciding)."""
        self.peers[sid] = Peer._make(peer)
        if self.group is None or not self.primary:
            return
        for backup in self.group[1:]:
            self._send(backup, "peer_promoted", sid, peer)
        self._send_votes_again(sid)

    @answered
    async def vote(
        self, key: Key, number: int, sid: int, error: BaseException | None, push: tuple | None
    ) -> None:
        """Server ``sid``'s outcome of its slice of update ``number`` of ``key``;
        from server 0 in dist_async, also which push that update is."""
        if push is not None and sid == 0:
            self.queues.setdefault(key, UpdateQueue()).learn(number, push)
        if number < self.rounds[key].done:
            return  # decided already (a vote sent again to a new primary)
        self._record_vote(key, number, sid, error)
        if not self.sync and key in self.queues:
            self._advance(key)

    def _record_vote(self, key: Key, number: int, sid: int, error: BaseException | None) -> None:
        """Count a vote; with every server's vote and this server's own update
        prepared, commit it if no slice failed, else keep nothing."""
        votes = self._votes.setdefault((key, number), {})
        votes[sid] = error
        if len(votes) < len(self.peers) or (key, number) not in self._prepared:
            return
        del self._votes[(key, number)]
        candidate, failure, senders = self._prepared.pop((key, number))
        if self.rounds[key].done != number:  # aborted meanwhile
            return
        failed = [sid for sid in sorted(votes) if votes[sid] is not None]
        if not failed:
            self.shard.commit({key: candidate})
        elif failure is None:  # another server's slice failed: report its error here too
            failure = Failure(votes[failed[0]], failed[0], [key], senders)
        if not self.sync:
            (sender,) = senders
            self.queues[key].decided(sender)
        if self.group is not None:  # finished once every backup has it
            pushes = [(s, k, q) for s, seqs in senders.items() for k, q in seqs.items()]
            self._replicate_rounds([key], failure, None, None if self.sync else pushes)
            return
        self._finish(key, failure)  # wakes the waiters, so after the queue's count
