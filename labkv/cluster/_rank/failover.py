"""Replicated servers, the rank side: one link per server id over its replicas.

A :class:`ReplicatedLink` calls the primary, and keeps every push the rank
sent it until a reply says that push is applied on every live replica (each
push or pull reply of a replicated server is ``(acked, epoch, payload)``: the
sender's pushes before ``acked`` are acknowledged). Run control goes to every
replica (``Method.broadcast`` in :mod:`labkv.cluster._protocol.methods`); a barrier to
the primary, its arrival also to the backups as a notice they do not answer
(``Method.backups``); init and the settings to the primary, which logs them for its backups.

A rank's pull is a **near read** where it can be
(:meth:`ReplicatedLink.near_backup`): the server has two replicas, the backup is
on the rank's own worker, and the rank pushed every pulled key there. The pull's
carried pushes go to the primary as pushes, and the pull to that backup, in
process, which answers once it applied the updates of the rank's last pushes of
those keys: a value there is on both replicas, as one the primary returns
after its backup acknowledged the update (so a failover changes no number), and
the answer saves the primary's reply and the backup's acknowledgement on the
way (``docs/cluster.md``, "Near reads"). The primary's push replies acknowledge the
kept pushes; the backup's read acknowledges none (``acked`` None).

The link owns its failover, as httpx keeps retries inside its transport: a
:class:`Call` that finds the primary lost (the scheduler dropped its worker,
or the connection broke) has its link promote the next live replica and
replay the kept pushes to it (the new primary skips what it already applied,
see the server's replication log, so a push is never counted twice), then
makes itself again on the new primary: a push not (the replay carried it), a
pull without the pushes it carried (they were replayed with the others). A
failed update the rank was already told of (its primary told it, then died
before its backups learned so) is not raised twice: the call is made again.
Above the seam a link fails only when every replica of its server is gone.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from .._errors import TIMEOUTS, ClusterError, ServerLost, answered_by, failed_update
from .._options import DEFAULT_TIMEOUT_S
from .._protocol.messages import Peer, Push
from .._protocol.methods import method as _method
from .._transport.base import POLL_S, ServerLink
from .replica_call import Call, Sent, call_or_failed

MakeLink = Callable[[int, str, str], ServerLink]
#: How often a store whose server lacks a replica asks for a new one again.
RETRY_S = 2.0


class ReplicatedLink(ServerLink):
    """Server ``sid`` as its replicas ``members`` (``(address, actor key)``,
    primary first), each reached through ``make_link(sid, address, actor_key)``
    (or the given ``links``); ``alive(address)`` says whether the scheduler
    still has a worker (None: only the member links' own news of a loss);
    ``find(sid)`` names the replicas of the server that the cluster holds now,
    asked once every replica the link knows is lost (None: nobody to ask).
    :meth:`bind` tells it whose calls it carries, and who hears of its
    failovers."""

    def __init__(
        self,
        sid: int,
        members: list[tuple[str, str]],
        make_link: MakeLink,
        links: list[ServerLink] | None = None,
        *,
        alive: Callable[[str], bool] | None = None,
        find: Callable[[int], list[tuple[str, str]]] | None = None,
    ):
        self.members = [Peer._make(m) for m in members]
        super().__init__(sid, self.members[0].address)
        self.failover = self  # keep, track, tend, bind, replicas: its own (see base.Failover)
        self.make_link, self.alive, self.find = make_link, alive, find
        if links is None:
            links = [make_link(sid, m.address, m.actor_key) for m in self.members]
        self.links = dict(zip(self.members, links, strict=True))
        self.loop = links[0].loop
        self.sender, self.timeout = "", DEFAULT_TIMEOUT_S
        self.on_failover: Callable[[ReplicatedLink, str | None], None] | None = None
        self.on_promoted: Callable[[ReplicatedLink], None] | None = None
        self.kept: dict[int, Any] = {}  # seq -> a push not yet acknowledged
        self.sent = 0  # pushes this link's sender sent (the next one's number)
        self.lock = threading.Lock()  # kept pushes: the rank's thread and its loop's
        self.failing = threading.Lock()  # one failover at a time
        self.epoch = 0  # the group's epoch in the last reply
        self.stale = False  # a reply named a newer epoch: refresh the members
        self.generation = 0  # failovers made by this link
        self.gone: list[Peer] = []  # replicas known lost
        self.told: set[tuple] = set()  # the failed updates raised (see told_before)
        self.wanted = len(self.members)  # how many replicas the group should have
        self.near = False  # pulls may be near reads (see bind)
        self.last_push: dict[Any, int] = {}  # key -> seq of the sender's last push of it
        self._retry_at = 0.0  # when to ask for a missing replica again

    @property
    def primary(self) -> ServerLink:
        """The link to the primary replica."""
        return self.links[self.members[0]]

    @property
    def local(self) -> Any:  # type: ignore[override]
        return self.primary.local

    def bind(
        self,
        sender: str,
        timeout: float,
        on_failover: Callable[[ReplicatedLink, str | None], None] | None = None,
        on_promoted: Callable[[ReplicatedLink], None] | None = None,
        near: bool = False,
    ) -> None:
        """Carry the calls of ``sender`` (whose kept pushes a failover replays),
        waiting at most ``timeout`` for a step of a failover; ``on_failover(link,
        old)`` hears of each failover (``old``: the lost primary's worker) and
        of each lost backup (``old`` None); ``on_promoted(link)`` of a new
        primary before the kept pushes are replayed to it; ``near``: the
        sender is a rank, whose pulls are near reads where they can be."""
        self.sender, self.timeout = sender, timeout
        self.on_failover, self.on_promoted = on_failover, on_promoted
        self.near = near

    def replicas(self) -> list[str]:
        return [m.address for m in self.members]

    # -- calls ----------------------------------------------------------------------------
    def call(self, method: str, *args: Any) -> Call:
        return Call(self, method, args, self.send(method, args), _method(method).acknowledged)

    def send(self, method: str, args: tuple, near: bool = True) -> Sent:
        """``method(*args)`` on the primary, and on every backup for a broadcast:
        the futures (a call that cannot be made is a failed one). A method with ``backups`` sends
        them that method first, unanswered, and the primary their actor keys as one more argument.
        A pull is a near read where it can be (and ``near``)."""
        others, row = [], _method(method)
        if method == "pull" and near:
            backup = self.near_backup(args[0])
            if backup is not None:
                return self._read_near(backup, args[0])
        if row.broadcast:
            others = [(m, call_or_failed(self.links[m], method, *args)) for m in self.members[1:]]
        elif row.backups is not None:
            told = []
            for m in self.members[1:]:
                with contextlib.suppress(ClusterError):  # a lost backup takes no note
                    self.links[m].notify(row.backups, *args)
                    told.append(m.actor_key)
            args = (*args, tuple(told))
        return Sent(call_or_failed(self.primary, method, *args), others)

    def near_backup(self, pull: Any) -> Peer | None:
        """The backup a pull reads from (see module doc), or None: the primary."""
        if not self.near or pull.step is not None or len(self.members) != 2 or self.wanted != 2:
            return None
        backup = self.members[1]
        if self.links[backup].local is None or self.links[backup].lost() is not None:
            return None
        last = self.last_push
        return backup if all(k in last for k in pull.keys) else None

    def _read_near(self, backup: Peer, pull: Any) -> Sent:
        """The pull's carried pushes to the primary, the pull to ``backup``."""
        carried = [call_or_failed(self.primary, "push", push) for push in pull.pushes]
        seqs = [self.last_push[k] for k in pull.keys]
        args = (pull.sender, pull.rank, pull.keys, seqs, pull.rows)
        return Sent(call_or_failed(self.links[backup], "read", *args), carried=carried)

    def track(self, method: str, future: Any) -> Call:
        return Call(self, method, (), Sent(future), acknowledge=False)

    def keep(self, seq: int, msg: Any) -> None:
        with self.lock:
            self.kept[seq] = msg
            self.sent = max(self.sent, seq + 1)
        if isinstance(msg, Push):
            for key in msg.header.keys:
                self.last_push[key] = seq

    def acknowledged(self, reply: tuple) -> Any:
        """Forget the pushes a reply ``(acked, epoch, payload)`` acknowledges
        (``acked`` None: none), and note a newer epoch (None: the reply names
        none); the payload."""
        acked, epoch, payload = reply
        with self.lock:
            for seq in [q for q in self.kept if acked is not None and q < acked]:
                del self.kept[seq]
        if epoch is not None and epoch != self.epoch:
            self.epoch, self.stale = epoch, True
        return payload

    def told_before(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a failed update this link has raised already (a
        primary that told it, then died before the backups learned so, is
        followed by one that tells it again); notes it as told if not."""
        failure = failed_update(exc)
        if failure is None:
            return False
        told = (failure.server, tuple(sorted(failure.seqs.items(), key=repr)))
        if told in self.told:
            return True
        self.told.add(told)
        return False

    def primary_lost(self) -> str | None:
        """Why the primary is known lost, or None."""
        why = self.primary.lost()
        if why is None and self.alive is not None and not self.alive(self.address):
            why = f"the scheduler no longer has its worker {self.address}"
        return why

    def backup_gone(self, peer: Peer) -> bool:
        """Whether the backup ``peer`` is known lost (its link, or the scheduler)."""
        link = self.links.get(peer)
        if link is not None and link.lost() is not None:
            return True
        return self.alive is not None and not self.alive(peer.address)

    def _lost_error(self, exc: BaseException) -> ServerLost:
        return self.primary._lost_error(exc)

    def tend(self) -> None:
        """Fail over now if the primary is known lost: a call of another server
        waited for may need this one (the slices of a key vote on each update);
        this link's own calls are made again when they are waited for."""
        if self.primary_lost() is not None:
            with contextlib.suppress(Exception):  # raised again when its call is waited for
                self.fail_over(self.generation)

    def after_reply(self) -> None:
        """After a reply, in the waiting thread: learn the group of a newer
        epoch, and ask for a missing replica again (see :meth:`short`)."""
        if self.stale:
            with contextlib.suppress(Exception):  # a lost primary: the next call fails over
                self.refresh()
        if self.short():
            self.on_failover(self, None)

    # -- the group --------------------------------------------------------------------------
    def refresh(self) -> None:
        """Learn the group's replicas from the primary (after a re-seed)."""
        epoch, members = self.primary.call("members").result(self.timeout)
        before = len(self.members)
        self.adopt(epoch, members)
        if len(self.members) < before and self.on_failover is not None:
            self.on_failover(self, None)

    def adopt(self, epoch: int, members: list[tuple[str, str]]) -> None:
        """Use the group ``members`` (primary first) of ``epoch``."""
        members = [Peer._make(m) for m in members]
        for m in members:
            if m not in self.links:
                self.links[m] = self.make_link(self.sid, m.address, m.actor_key)
        self.members, self.address = members, members[0].address
        self.epoch, self.stale = epoch, False

    def prune(self, live: set[str]) -> None:
        """Forget the replicas on workers not in ``live`` (gone: a promote names them)."""
        self.gone.extend(m for m in self.members if m.address not in live and m not in self.gone)
        self.members = [m for m in self.members if m.address in live]

    def short(self) -> bool:
        """Whether the group lacks a replica and it is time to ask for one again
        (at most every ``RETRY_S``: a worker to seed it on may join later)."""
        now = time.monotonic()
        if len(self.members) >= self.wanted or self.on_failover is None or now < self._retry_at:
            return False
        self._retry_at = now + RETRY_S
        return True

    def add(self, peer: tuple[str, str], link: ServerLink) -> None:
        """A new replica (re-seeded by this process) and its link."""
        self.links[Peer._make(peer)] = link

    def fail_over(self, generation: int | None = None) -> None:
        """The primary is lost (a call of ``generation`` found it so; None:
        whatever the calls saw): promote the next live replica and replay the
        sender's pushes not yet acknowledged. Raises :class:`ServerLost`
        naming the server and every worker of it when no replica is left."""
        # Not under self.lock: the loop thread takes it to read replies, and
        # promote's reply comes through that loop.
        with self.failing:
            if generation is None or generation == self.generation:  # else: done already
                self._fail_over()

    def _answer(self, peer: Peer, call: Any) -> Any:
        """The result of ``call`` to replica ``peer``, waited for at most
        ``self.timeout``; every ``POLL_S`` it looks whether ``peer`` is known
        lost, and raises :class:`ServerLost` then. A call to a dead worker
        whose connection must be opened again sits in Dask's connect retries
        (30 s), and on a busy machine the scheduler may drop that worker only
        after this link looked: its word must end the wait, not the retries."""
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            try:
                return call.result(max(0.0, min(POLL_S, left)))
            except TIMEOUTS:
                if left <= POLL_S:
                    raise
                if self.backup_gone(peer):
                    lost = f"replica of server {self.sid} on {peer.address} is lost"
                    raise ServerLost(lost) from None

    def _promote_next(self) -> tuple[int, list[tuple[str, str]]] | None:
        """Promote the first live replica not known lost: the group it answers
        with, or None when none is left. A replica that joined and has no seed
        yet refuses (None): it holds no state to go on from."""
        for candidate in [m for m in self.members if m not in self.gone]:
            try:
                lost = [tuple(m) for m in self.gone]
                call = self.links[candidate].call("promote", lost)
                answer = self._answer(candidate, call)
            except Exception as exc:
                if answered_by(exc) is not None:  # its own refusal, not its loss
                    raise
                answer = None
            if answer is not None:
                return answer
            self.gone.append(candidate)
        return None

    def _learn_replicas(self) -> bool:
        """Every replica this link knows is lost: learn the group from a replica
        the cluster holds that it has not heard of (one seeded after this rank's
        last reply); whether there is one to try."""
        if self.find is None:
            return False
        try:
            found = [Peer._make(p) for p in self.find(self.sid)]
        except Exception:  # the scheduler did not answer: no news of a replica
            return False
        for peer in [p for p in found if p not in self.gone and p not in self.members]:
            link = self.links.get(peer) or self.make_link(self.sid, peer.address, peer.actor_key)
            self.links[peer] = link
            try:
                _, members = self._answer(peer, link.call("members"))
            except Exception:
                continue
            known = [Peer._make(m) for m in members]
            if any(m not in self.gone for m in known):
                for m in known:
                    if m not in self.links:
                        self.links[m] = self.make_link(self.sid, m.address, m.actor_key)
                self.members = known
                return True
        return False

    def _fail_over(self) -> None:
        old = self.members[0]
        self.gone.append(old)
        for m in self.members[1:]:
            if m not in self.gone and self.backup_gone(m):
                self.gone.append(m)
        promoted = self._promote_next()
        if promoted is None and self._learn_replicas():
            promoted = self._promote_next()
        if promoted is None:
            gone = [m.address for m in dict.fromkeys(self.gone)]
            raise ServerLost(
                f"server {self.sid} is lost: every replica of it is gone (Dask workers "
                f"{gone}), with its keys' values and optimizer states"
            )
        epoch, members = promoted
        self.adopt(epoch, members)
        if self.on_promoted is not None:
            self.on_promoted(self)
        with self.lock:
            first = min(self.kept) if self.kept else self.sent
            pushes = [self.kept[q] for q in sorted(self.kept)]
        self.generation += 1
        try:
            reply = self.primary.call("replay", self.sender, first, pushes).result(self.timeout)
        except TIMEOUTS:
            raise ClusterError(
                f"server {self.sid}'s new primary on {self.address} did not take the "
                f"{len(pushes)} pushes not yet acknowledged within {self.timeout:g} s"
            ) from None
        self.acknowledged(reply)
        if self.on_failover is not None:
            self.on_failover(self, old.address)
