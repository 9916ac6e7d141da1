"""Replicated servers, the rank side: one link per server id over its replicas.

A :class:`ReplicatedLink` calls the primary, and keeps every push the rank
sent it until a reply says that push is applied on every live replica (each
push or pull reply of a replicated server is ``(acked, epoch, payload)``: the
sender's pushes before ``acked`` are acknowledged). When a call finds the
primary lost (the scheduler dropped its worker, or the connection broke),
:meth:`ReplicatedLink.fail_over` promotes the next live replica and replays
the kept pushes to it; the new primary skips what it already applied (see
``_replication``), so a push is never counted twice. The waiting code then
calls again what had failed (:meth:`labkv.cluster._rank.calls.Calls.wait`). Control methods
(init, updaters, optimizer states, run control) go to every replica.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .._errors import TIMEOUTS, ClusterError
from .._protocol.messages import Peer, Push
from .._transport.base import ServerLink

#: Methods every replica runs (the others go to the primary only).
BROADCAST = frozenset(
    {"init", "set_updater", "set_optimizer", "set_states", "configure", "abort", "link"}
)
#: Methods whose reply is ``(acked, epoch, payload)``.
ACKNOWLEDGED = frozenset({"push", "pull", "replay"})

MakeLink = Callable[[int, str, str], ServerLink]
#: How often a store whose server lacks a replica asks for a new one again.
RETRY_S = 2.0


def _failed(exc: BaseException) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_exception(exc)
    return future


def kept_copy(msg: Push) -> Push:
    """``msg`` with its own copies of the big arrays it lends (its packed
    buffer is already its own)."""
    return msg._replace(bigs=[np.array(b) for b in msg.bigs])


def is_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says a server is lost (not an answer it gave)."""
    return getattr(exc, "_labkv_lost", False)


class Call:
    """A call through a :class:`ReplicatedLink`: the primary's future (plus the
    backups' for a broadcast), unwrapped when read; it remembers what it called
    so that it can be called again after a failover."""

    __slots__ = ("inner", "others", "link", "method", "args", "generation")

    def __init__(self, link: ReplicatedLink, method: str, args: tuple, inner: Any, others: list):
        self.link, self.method, self.args, self.inner, self.others = (
            link,
            method,
            args,
            inner,
            others,
        )
        self.generation = link.generation

    def result(self, timeout: float | None = None) -> Any:
        out = self.inner.result(timeout)
        for other in self.others:  # a backup that is gone is no error here
            try:
                other.result(timeout)
            except TIMEOUTS:
                raise
            except Exception as exc:
                if getattr(exc, "_labkv_server", None) is not None:  # the backup's answer
                    raise
        if self.method in ACKNOWLEDGED:
            return self.link.acknowledged(out)
        return out

    def done(self) -> bool:
        return self.inner.done() and all(o.done() for o in self.others)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            self.result(timeout)
        except TIMEOUTS:
            raise
        except BaseException as exc:
            return exc
        return None

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        self.inner.add_done_callback(lambda _: fn(self))


class ReplicatedLink(ServerLink):
    """Server ``sid`` as its replicas ``members`` (``(address, actor key)``,
    primary first), each reached through ``make_link(sid, address, actor_key)``
    (or the given ``links``); ``on_failover(sid, old, replicas)`` hears each
    failover this link makes (``old``: the lost primary's worker) and each
    backup it learns is lost (``old`` None); ``on_promoted(link)`` hears of a
    new primary before the kept pushes are replayed to it."""

    replicated = True

    def __init__(
        self,
        sid: int,
        members: list[tuple[str, str]],
        make_link: MakeLink,
        links: list[ServerLink] | None = None,
        on_failover: Callable[[int, str | None, list[str]], None] | None = None,
        alive: Callable[[str], bool] | None = None,
        on_promoted: Callable[[ReplicatedLink], None] | None = None,
    ):
        self.members = [Peer._make(m) for m in members]
        self.on_promoted = on_promoted
        super().__init__(sid, self.members[0].address)
        self.make_link, self.on_failover, self.alive = make_link, on_failover, alive
        if links is None:
            links = [make_link(sid, m.address, m.actor_key) for m in self.members]
        self.links = dict(zip(self.members, links, strict=True))
        self.loop = links[0].loop
        self.kept: dict[int, Any] = {}  # seq -> a push not yet acknowledged
        self.lock = threading.Lock()  # kept pushes: the rank's thread and its loop's
        self.failing = threading.Lock()  # one failover at a time
        self.epoch = 0  # the group's epoch in the last reply
        self.stale = False  # a reply named a newer epoch: refresh the members
        self.generation = 0  # failovers made by this link
        self.gone: list[Peer] = []  # replicas known lost
        self.wanted = len(self.members)  # how many replicas the group should have
        self._retry_at = 0.0  # when to ask for a missing replica again

    @property
    def primary(self) -> ServerLink:
        return self.links[self.members[0]]

    @property
    def same_process(self) -> bool:  # type: ignore[override]
        return self.primary.same_process

    @property
    def server(self) -> Any:  # type: ignore[override]
        return self.primary.server

    def listen(
        self,
        on_failover: Callable[[int, str | None, list[str]], None],
        on_promoted: Callable[[ReplicatedLink], None],
    ) -> None:
        """Tell ``on_failover`` and ``on_promoted`` (see the class doc) of what
        this link does from now on (a store listens to its links)."""
        self.on_failover, self.on_promoted = on_failover, on_promoted

    def addresses(self) -> list[str]:
        """The workers of the replicas, primary first."""
        return [m.address for m in self.members]

    # -- calls ----------------------------------------------------------------------------
    def call(self, method: str, *args: Any) -> Call:
        others = []
        if method in BROADCAST:
            for m in self.members[1:]:
                try:
                    others.append(self.links[m].call(method, *args))
                except ClusterError as exc:
                    others.append(_failed(exc))
        try:
            inner = self.primary.call(method, *args)
        except ClusterError as exc:
            inner = _failed(exc)
        return Call(self, method, args, inner, others)

    def keep(self, seq: int, msg: Any) -> None:
        """Keep push ``msg`` (the ``seq``-th to this server) until it is acknowledged."""
        with self.lock:
            self.kept[seq] = msg

    def acknowledged(self, reply: tuple) -> Any:
        """Forget the pushes a reply ``(acked, epoch, payload)`` acknowledges; the payload."""
        acked, epoch, payload = reply
        with self.lock:
            for seq in [q for q in self.kept if q < acked]:
                del self.kept[seq]
        if epoch != self.epoch:
            self.epoch, self.stale = epoch, True
        return payload

    def lost(self) -> str | None:
        why = self.primary.lost()
        if why is None and self.alive is not None and not self.alive(self.address):
            why = f"the scheduler no longer has its worker {self.address}"
        return why

    def lost_error(self, exc: BaseException) -> ClusterError:
        error = self.primary.lost_error(exc)
        error._labkv_lost = True
        return error

    # -- failover ---------------------------------------------------------------------------
    def refresh(self, timeout: float) -> None:
        """Learn the group's replicas from the primary (after a re-seed)."""
        epoch, members = self.primary.call("members").result(timeout)
        before = len(self.members)
        self.adopt(epoch, members)
        if len(self.members) < before and self.on_failover is not None:
            self.on_failover(self.sid, None, self.addresses())

    def adopt(self, epoch: int, members: list[tuple[str, str]]) -> None:
        """Use the group ``members`` (primary first) of ``epoch``."""
        members = [Peer._make(m) for m in members]
        for m in members:
            if m not in self.links:
                self.links[m] = self.make_link(self.sid, m.address, m.actor_key)
        self.members, self.address = members, members[0].address
        self.epoch, self.stale = epoch, False

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

    def fail_over(self, sender: str, sent: int, generation: int, timeout: float) -> None:
        """The primary is lost (a call of ``generation`` found it so): promote the
        next live replica and replay this sender's pushes not yet acknowledged
        (``sent``: how many it has sent to this server). Raises naming the
        server and every worker of it when no replica is left."""
        # Not under self.lock: the loop thread takes it to read replies, and
        # promote's reply comes through that loop.
        with self.failing:
            self._fail_over(sender, sent, generation, timeout)

    def _fail_over(self, sender: str, sent: int, generation: int, timeout: float) -> None:
        if generation != self.generation:
            return  # another call of this rank already failed over
        old = self.members[0]
        self.gone.append(old)
        for m in self.members[1:]:
            if m not in self.gone and self.links[m].lost() is not None:
                self.gone.append(m)
        for candidate in [m for m in self.members if m not in self.gone]:
            try:
                lost = [tuple(m) for m in self.gone]
                epoch, members = self.links[candidate].call("promote", lost).result(timeout)
            except Exception as exc:
                if getattr(exc, "_labkv_server", None) is not None and not is_lost(exc):
                    raise
                self.gone.append(candidate)
                continue
            break
        else:
            gone = [m.address for m in dict.fromkeys(self.gone)]
            raise ClusterError(
                f"server {self.sid} is lost: every replica of it is gone (Dask workers "
                f"{gone}), with its keys' values and optimizer states"
            )
        self.adopt(epoch, members)
        if self.on_promoted is not None:
            self.on_promoted(self)
        with self.lock:
            first = min(self.kept) if self.kept else sent
            pushes = [self.kept[q] for q in sorted(self.kept)]
        self.generation += 1
        try:
            reply = self.primary.call("replay", sender, first, pushes).result(timeout)
        except TIMEOUTS:
            raise ClusterError(
                f"server {self.sid}'s new primary on {self.address} did not take the "
                f"{len(pushes)} pushes not yet acknowledged within {timeout:g} s"
            ) from None
        self.acknowledged(reply)
        if self.on_failover is not None:
            self.on_failover(self.sid, old.address, self.addresses())


def check_replicated_updater(updater: Any, pieces: dict, sync: bool, ssp: bool) -> None:
    """Refuse a custom updater on a sliced key of a replicated dist_ssp store
    (its clocks of a sliced key's pushes, which tick as they arrive, are not
    replicated with the updates server 0 orders), before anything is sent."""
    if updater is None or sync or not ssp:
        return
    sliced = [k for k, placed in pieces.items() if len(placed) > 1]
    if sliced:
        raise ValueError(
            f"a custom updater on keys sliced across servers ({sliced[:5]}) is not "
            "available in a dist_ssp store with replicas > 1; use an optimizer "
            "(set_optimizer), a dist_sync or dist_async store, or a larger bigarray_bound "
            "so that these keys are not sliced"
        )
