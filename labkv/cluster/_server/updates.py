"""How a server turns pushes into updates: a completed dist_sync round or a
dist_async push of a sliced key, applied at once or prepared and voted on.

A sliced key's update commits on every server or none, so with a custom
updater (which may fail on one slice) each server prepares its slice and
tells the others whether it succeeded (:meth:`Updates.vote`); every server
commits when all slices succeeded (:meth:`Updates.record`). In dist_async the
servers also apply a sliced key's updates in one order: the order in which
server 0 received them (:class:`~labkv.cluster._server.sender_order.UpdateQueue`).
Plain updates (whole keys, or no custom updater) are applied at once.

An update finishes (its pulls may read it, its ranks push the next) when the
server's log says so: at once without replicas, once every backup has it with
them (:mod:`labkv.cluster._server.replication.replica_log`). With replicas each vote
is logged before it is sent (server 0's names the push it placed, so a new
server-0 primary keeps its old primary's order), and a new primary tells the
other servers where it is (:meth:`Updates.announce`) and sends them its recent
votes again, and they send it theirs: a vote sent to or from a dead primary
is lost with it.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import cloudpickle

from ..._types import Key
from ...shard import Shard
from .._errors import ClusterError, Failure, add_note, portable
from .._protocol.entries import Vote
from .._protocol.messages import Peer
from .._tasks import TaskGroup
from .._transport.base import Host
from .replication.step_marks import StepMarks, copied
from .rounds import Round, SyncRounds, failure_note, pushed_by
from .sender_order import UpdateQueues
from .waiting import Waiters

if TYPE_CHECKING:
    from .key_table import KeyTable
    from .replication.null import NullLog
    from .replication.replica_log import ReplicaLog


class Peers:
    """The store's servers ``(address, actor key)`` by server id, as server
    ``sid`` reaches them: calls it does not wait for (a vote never blocks the
    loop; a lost peer shows as an update that times out naming it)."""

    __slots__ = ("sid", "host", "tasks", "peers")

    def __init__(self, sid: int, host: Host, tasks: TaskGroup) -> None:
        self.sid, self.host, self.tasks = sid, host, tasks
        self.peers: list[Peer] = []

    def __len__(self) -> int:
        return len(self.peers)

    def __getitem__(self, sid: int) -> Peer:
        return self.peers[sid]

    def link(self, peers: list[tuple[str, str]]) -> None:
        self.peers = [Peer._make(p) for p in peers]

    def moved(self, sid: int, peer: Peer) -> None:
        """Server ``sid`` has a new primary, ``peer``."""
        self.peers[sid] = peer

    def others(self) -> Iterator[int]:
        return (p for p in range(len(self.peers)) if p != self.sid)

    def send(self, peer: int | Peer, method: str, *args: Any) -> None:
        """Call ``method`` of server ``peer`` (its id, or a replica) without waiting."""
        to = self.peers[peer] if isinstance(peer, int) else peer
        try:
            call = self.host.call_peer(to, method, list(args))
        except OSError:  # known dead at once (in-process): as a call that failed
            return
        self.tasks.spawn(call, quiet=True)

    def snapshot(self) -> list[tuple[str, str]]:
        return [tuple(p) for p in self.peers]


class SliceVotes:
    """The votes on each sliced update so far, and this server's prepared
    slices waiting for them: ``(candidate, failure, senders)`` per update."""

    __slots__ = ("votes", "prepared")

    def __init__(self) -> None:
        self.votes: dict[tuple[Key, int], dict[int, BaseException | None]] = {}
        self.prepared: dict[tuple[Key, int], tuple[Any, Failure | None, dict]] = {}

    def prepare(
        self, key: Key, number: int, candidate: Any, failure: Failure | None, senders: dict
    ) -> None:
        self.prepared[(key, number)] = (candidate, failure, senders)

    def is_prepared(self, key: Key, number: int) -> bool:
        return (key, number) in self.prepared

    def count(
        self, key: Key, number: int, sid: int, error: BaseException | None, servers: int
    ) -> tuple[dict, Any, Failure | None, dict] | None:
        """Count server ``sid``'s vote; once all ``servers`` voted and this one
        prepared its slice: ``(votes, candidate, failure, senders)``."""
        votes = self.votes.setdefault((key, number), {})
        votes[sid] = error
        if len(votes) < servers or (key, number) not in self.prepared:
            return None
        del self.votes[(key, number)]
        return (votes, *self.prepared.pop((key, number)))

    def forget(self, key: Key, number: int) -> None:
        """Update ``number`` of ``key`` is decided: a vote sent again is dropped."""
        self.votes.pop((key, number), None)

    def missing(self, key: Key, number: int, sid: int, servers: int) -> list[int]:
        voted = self.votes.get((key, number), {})
        if (key, number) in self.prepared:
            voted = {**voted, sid: None}
        return [p for p in range(servers) if p not in voted]

    def clear(self) -> None:
        self.votes.clear()
        self.prepared.clear()


class KeptVotes:
    """This server's votes of the last two updates of each key (a backup keeps
    its primary's), sent again to a new primary of a peer."""

    __slots__ = ("votes",)

    def __init__(self) -> None:
        self.votes: dict[Key, dict[int, tuple[BaseException | None, tuple | None]]] = {}

    def keep(self, vote: Vote) -> None:
        mine = self.votes.setdefault(vote.key, {})
        mine[vote.number] = (vote.error, vote.push)
        for old in [n for n in mine if n < vote.number - 1]:
            del mine[old]

    def __iter__(self) -> Iterator[Vote]:
        for key, mine in self.votes.items():
            for number, (error, push) in mine.items():
                yield Vote(key, number, error, push)

    def placed(self, key: Key) -> dict[int, tuple[str, int]]:
        """Server 0's kept votes of ``key``: the pushes it placed, by position."""
        mine = self.votes.get(key, {})
        return {n: push for n, (_, push) in mine.items() if push is not None}

    def snapshot(self) -> bytes:
        return cloudpickle.dumps(self.votes)  # errors of a notebook's class

    def restore(self, snap: bytes) -> None:
        self.votes = pickle.loads(snap)


class Updates:
    """Applying, preparing and voting on the updates of server ``sid`` (see
    module doc); ``round_ended(key, round)`` is called as a round finishes."""

    def __init__(
        self,
        sid: int,
        shard: Shard,
        table: KeyTable,
        rounds: SyncRounds,
        votes: SliceVotes,
        kept: KeptVotes,
        queues: UpdateQueues,
        peers: Peers,
        log: NullLog | ReplicaLog,
        waiting: Waiters,
        round_ended: Callable[[Key, Round], None],
        marks: StepMarks,
    ) -> None:
        self.sid, self.shard, self.table, self.rounds = sid, shard, table, rounds
        self.votes, self.kept, self.queues, self.peers = votes, kept, queues, peers
        self.log, self.waiting, self.round_ended = log, waiting, round_ended
        self.marks = marks
        self.gone: tuple[str, ...] = ()  # senders the run goes on without (see dropped)

    def use(self, log: NullLog | ReplicaLog) -> None:
        """Issue to ``log`` from now on (the server joined a group of replicas)."""
        self.log = log

    def failure(
        self, exc: BaseException, keys: list[Key], senders: dict, rounds: dict | None = None
    ) -> Failure:
        """The failure of an update of ``keys``: the updater's own exception,
        noted with where it was raised, owed to ``senders``."""
        add_note(exc, failure_note(self.sid, keys, rounds))
        return Failure(portable(exc), self.sid, keys, senders)

    def complete(self, keys: list[Key], sender: str) -> None:
        """Apply the rounds of ``keys`` (all ranks pushed) in one ``Shard.apply``.

        The update of a sliced key with a custom updater is only prepared here:
        it commits when every server of the key has prepared its slice (see
        :meth:`vote`). If the update fails, the completing push (``sender``'s)
        gets the error now and the other ranks at their next pull of the keys."""
        deferred = [k for k in keys if k in self.table.sliced and self.shard.updater is not None]
        rounds = {k: self.rounds[k] for k in keys}
        # a step loop's rounds keep the value they replace (see .replication.step_marks)
        if self.marks:
            for key in keys:
                if self.marks.marked(key):
                    value = copied(self.shard.read(key))
                    self.marks.keep_before(key, rounds[key].done, value)
        batch = [(k, [rounds[k].pending[q] for q in sorted(rounds[k].pending)]) for k in keys]
        prepared, failure = None, None
        try:
            if deferred:
                prepared = self.shard.prepare(batch)
            else:
                self.shard.apply(batch)
        except Exception as exc:  # the round still ends, so no rank waits forever
            numbers = {k: r.done for k, r in rounds.items()}
            failure = self.failure(exc, keys, pushed_by(keys, rounds), numbers)
        now = [k for k in keys if k not in deferred]
        if prepared is not None and now:
            self.shard.commit({k: prepared[k] for k in now})
        if now:
            self.log.rounds_done(now, failure, sender, None, self.finish)
        for key in deferred:
            m = rounds[key].done
            candidate = None if prepared is None else prepared[key]
            self.votes.prepare(key, m, candidate, failure, pushed_by([key], rounds))
            self.vote(key, m, None if failure is None else failure.error)
        if failure is not None and now:
            raise failure.report_to(sender)

    def finish(self, key: Key, failure: Failure | None) -> None:
        r = self.rounds[key]
        self.votes.forget(key, r.done)
        self.round_ended(key, r)
        r.finish(failure)
        self.waiting.wake()
        if key in self.queues:
            self.advance(key)  # the key's next update in server 0's order

    def missing(self, key: Key) -> str:
        """What the open update of ``key`` waits for: ranks, or servers' votes."""
        r = self.rounds[key]
        if not r.missing(self.rounds.num_workers) and self.votes.is_prepared(key, r.done):
            return self.missing_votes(key)
        return self.rounds.missing(key)

    def missing_votes(self, key: Key) -> str:
        number = self.rounds[key].done
        late = self.votes.missing(key, number, self.sid, len(self.peers))
        return f"servers {late} have not reported their slice of update {number} of key {key!r}"

    def queue(self, sender: str, seq: int, key: Key, value: Any) -> None:
        """Queue ``sender``'s push of a sliced key (a copy: the message's buffer is
        not ours to keep) and apply what is next in server 0's order.

        With a custom updater, a sliced key's update commits on all its slices or
        none, so every server applies the key's updates in one order: the order in
        which server 0 received the pushes (it queues every key of a message at
        once, so its orders of all keys agree), told with its votes. A push
        returns once its updates are decided; no wait can form a cycle, since
        every server decides in server 0's single order of messages."""
        self.queues.of(key).arrive(sender, value.copy(), seq, self.sid == 0)
        self.advance(key)

    def advance(self, key: Key) -> None:
        """Prepare the next update of ``key`` in order, if it is here, and vote on it."""
        number = self.rounds[key].done
        queue = self.queues[key]
        taken = queue.take(number) or queue.lost(number, self.gone)
        if taken is None:
            return
        (sender, n), value, seq = taken
        senders = {sender: {key: seq}}
        candidate, failure = None, None
        try:
            if value is None:
                raise ClusterError(
                    f"update {number} of key {key!r} failed: its push never reached server "
                    f"{self.sid} (its rank was lost, and the run goes on without it)"
                )
            candidate = self.shard.prepare([(key, [value])])[key]
        except Exception as exc:
            failure = self.failure(exc, [key], senders)
        self.votes.prepare(key, number, candidate, failure, senders)
        self.vote(key, number, None if failure is None else failure.error, (sender, n))

    async def decided(self, sender: str, keys: list[Key]) -> None:
        """Wait until ``sender``'s queued updates of ``keys`` are decided; raise
        the first that failed (reported to ``sender`` once)."""
        for key in keys:
            q = self.queues[key]
            await self.waiting.until(
                lambda q=q: not q.undecided.get(sender, 0), lambda k=key: self.missing_votes(k)
            )
        for key in keys:
            failed = self.rounds[key].report_to(sender)
            if failed is not None:
                raise failed

    def vote(
        self, key: Key, number: int, error: BaseException | None, push: tuple | None = None
    ) -> None:
        """Tell every server of the store whether this server's slice of update
        ``number`` of ``key`` (a dist_sync round, or the ``number``-th dist_async
        update, ``push``) succeeded (``error`` None), once the log has the vote,
        then decide."""
        vote = Vote(key, number, error, push)
        self.log.vote(vote, lambda: self.send_vote(vote))
        self.record(key, number, self.sid, error)

    def send_vote(self, vote: Vote) -> None:
        for peer in self.peers.others():
            self.peers.send(peer, "vote", vote.key, vote.number, self.sid, vote.error, vote.push)

    def send_votes_again(self, peer: int) -> None:
        for vote in self.kept:
            self.peers.send(peer, "vote", vote.key, vote.number, self.sid, vote.error, vote.push)

    def received(
        self, key: Key, number: int, sid: int, error: BaseException | None, push: tuple | None
    ) -> None:
        """Server ``sid``'s vote (see ``Server.vote``)."""
        if push is not None and sid == 0:
            self.queues.of(key).learn(number, push)
        if number < self.rounds[key].done:
            return  # decided already (a vote sent again to a new primary)
        self.record(key, number, sid, error)
        if key in self.queues:
            self.advance(key)

    def record(self, key: Key, number: int, sid: int, error: BaseException | None) -> None:
        """Count a vote; with every server's vote and this server's own update
        prepared, commit it if no slice failed, else keep nothing."""
        decided = self.votes.count(key, number, sid, error, len(self.peers))
        if decided is None:
            return
        votes, candidate, failure, senders = decided
        if self.rounds[key].done != number:  # aborted meanwhile
            return
        failed = [sid for sid in sorted(votes) if votes[sid] is not None]
        if not failed:
            self.shard.commit({key: candidate})
        elif failure is None:  # another server's slice failed: report its error here too
            failure = Failure(votes[failed[0]], failed[0], [key], senders)
        queue = self.queues.get(key)
        if queue is not None:  # dist_async: one push per update
            (sender,) = senders
            queue.decided(sender)
        pushes = [(s, k, q) for s, seqs in senders.items() for k, q in seqs.items()]
        self.log.rounds_done([key], failure, None, pushes, self.finish)

    def announce(self, me: Peer) -> None:
        """A new primary tells the other servers of the store where it is and
        sends them its recent votes again."""
        if not len(self.peers):
            return
        self.peers.moved(self.sid, me)
        for peer in self.peers.others():
            self.peers.send(peer, "peer_promoted", self.sid, tuple(me))
            self.send_votes_again(peer)

    def peer_moved(self, sid: int, peer: tuple[str, str]) -> None:
        """Server ``sid``'s new primary is ``peer``: votes go there from now on.
        A primary's backups learn it too, and the new primary gets its votes of
        the last two updates of each key again (it may have missed them, and
        lacks at most the update its old primary was deciding)."""
        self.peers.moved(sid, Peer._make(peer))
        if not self.log.primary:
            return
        for backup in self.log.backups:
            self.peers.send(backup, "peer_promoted", sid, peer)
        self.send_votes_again(sid)

    def dropped(self, prefix: str) -> None:
        """The senders of ``prefix`` are gone for good (a rank the run goes on
        without): a push of theirs that server 0 placed and that never reached
        this server fails here, so that its update commits on no slice and the
        key's later updates go on."""
        self.gone = (*self.gone, prefix)
        for key in list(self.queues.queues):
            self.advance(key)

    def abort(self) -> None:
        """Forget every vote and queued update (an aborted run)."""
        self.votes.clear()
        self.queues.clear()
