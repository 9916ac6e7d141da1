"""The orders a server keeps: each sender's pushes in their sequence numbers'
order (:class:`SenderOrder`), and the order in which the servers of a sliced
dist_async key apply its updates (:class:`UpdateQueue`).

A rank's pushes may travel on different connections, so each carries a
per-(sender, server) sequence number and the server applies a sender's pushes
in that order; a pull carries how many pushes the sender sent and first waits
for them, so a rank can send a push without waiting for its reply and still
read its own write.

Every server of a sliced key with a custom updater applies that key's pushes
in the order server 0 received them (server 0 names the next push in its
vote), so that all slices update together or not at all.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterator
from typing import Any

from ..._types import Key
from .waiting import Waiters


class _Ready:
    """An awaitable that is done at once."""

    __slots__ = ()

    def __await__(self) -> Iterator[None]:
        return iter(())


_READY = _Ready()


class SenderOrder:
    """How many pushes of each sender this server has applied (see module doc).

    >>> order = SenderOrder(Waiters("server 0", 1.0))
    >>> order.passed("a", 0); order.passed("a", 1); order.next("a")
    2
    >>> order.passed("a", 0); order.next("a")  # a resend after later pushes
    2
    """

    __slots__ = ("waiting", "next_seq")

    def __init__(self, waiting: Waiters) -> None:
        self.waiting = waiting
        self.next_seq: dict[str, int] = {}

    def next(self, sender: str) -> int:
        """The sequence number of ``sender``'s next push here."""
        return self.next_seq.get(sender, 0)

    def arrived(self, sender: str, seq: int, who: str) -> Awaitable[None]:
        """Wait until ``sender``'s first ``seq`` pushes have been applied here
        (they may travel on other connections than the call that waits); an
        awaitable, done at once (no coroutine made) when they have."""
        if self.next_seq.get(sender, 0) >= seq:
            return _READY
        return self.waiting.until(
            lambda: self.next_seq.get(sender, 0) >= seq,
            lambda: f"push #{self.next_seq.get(sender, 0)} from {who} never arrived",
        )

    def passed(self, sender: str, seq: int) -> None:
        """``sender``'s ``seq``-th push is applied (a resend may come after later pushes)."""
        if self.next_seq.get(sender, 0) <= seq:
            self.next_seq[sender] = seq + 1

    def skip_to(self, sender: str, first: int) -> None:
        """``sender``'s pushes before its ``first``-th are applied everywhere (a replay)."""
        if self.next_seq.get(sender, 0) < first:
            self.next_seq[sender] = first
            self.waiting.wake()

    def snapshot(self) -> dict[str, int]:
        return dict(self.next_seq)

    def restore(self, snap: dict[str, int]) -> None:
        self.next_seq = dict(snap)


class UpdateQueue:
    """dist_async updates of one sliced key on one server, applied in the order
    server 0 received them (every server of the key follows that order, so the
    slices of each update commit together; see ``Updates.advance``).

    A push is ``(sender, n)``: the ``n``-th push of the key by ``sender``, the
    same push on every server (a sender's pushes reach each server in order).

    >>> q = UpdateQueue()
    >>> q.arrive("a", value=1.0, seq=7, leader=False)
    >>> q.take(0) is None  # server 0 has not said which push is first
    True
    >>> q.learn(0, ("a", 0))
    >>> q.take(0)
    (('a', 0), 1.0, 7)
    """

    __slots__ = ("data", "order", "assigned", "arrived", "undecided", "busy")

    def __init__(self) -> None:
        self.data: dict[tuple[str, int], tuple[Any, int]] = {}  # push -> (value, seq)
        self.order: dict[int, tuple[str, int]] = {}  # position -> push
        self.assigned = 0  # on server 0: the next position to give
        self.arrived: dict[str, int] = {}  # sender -> pushes of the key received
        self.undecided: dict[str, int] = {}  # sender -> its pushes not yet decided
        self.busy = False  # an update is prepared and waits for the other servers

    def arrive(self, sender: str, value: Any, seq: int, leader: bool) -> None:
        n = self.arrived.get(sender, 0)
        self.arrived[sender] = n + 1
        self.undecided[sender] = self.undecided.get(sender, 0) + 1
        self.data[(sender, n)] = (value, seq)
        if leader and (sender, n) not in self.order.values():  # not placed before a failover
            self.order[self.assigned] = (sender, n)
            self.assigned += 1

    def learn(self, position: int, push: tuple[str, int]) -> None:
        """Server 0 says which push is the ``position``-th update."""
        self.order.setdefault(position, tuple(push))

    def applied(self, sender: str) -> None:
        """A backup applied an update of ``sender``'s next push (the primary's
        log entry): a new primary numbers that sender's later pushes on."""
        self.arrived[sender] = self.arrived.get(sender, 0) + 1

    def resume(self, done: int, told: dict[int, tuple[str, int]]) -> None:
        """Server 0's new primary, ``done`` updates decided: the pushes its old
        primary placed at the positions in ``told`` (and told the other servers)
        keep them; new pushes are placed after."""
        for position, push in told.items():
            if position >= done:
                self.learn(position, push)
        self.assigned = max([self.assigned, done, *(p + 1 for p in self.order)])

    def take(self, position: int) -> tuple[tuple[str, int], Any, int] | None:
        """The push to apply as update ``position``, once its order and data are here."""
        if self.busy:
            return None
        push = self.order.get(position)
        if push is None or push not in self.data:
            return None
        del self.order[position]
        value, seq = self.data.pop(push)
        self.busy = True
        return push, value, seq

    def lost(
        self, position: int, gone: tuple[str, ...]
    ) -> tuple[tuple[str, int], None, int] | None:
        """The push to apply as update ``position`` when it will never arrive
        here (its sender's name starts with one of ``gone``: a rank the run
        goes on without), taken as :meth:`take` would, without a value.

        >>> q = UpdateQueue()
        >>> q.learn(0, ("run/1.0/a", 0))
        >>> q.lost(0, ()), q.lost(0, ("run/1.",))
        (None, (('run/1.0/a', 0), None, -1))
        """
        if self.busy or not gone:
            return None
        push = self.order.get(position)
        if push is None or push in self.data or not push[0].startswith(gone):
            return None
        del self.order[position]
        sender = push[0]
        self.arrived[sender] = self.arrived.get(sender, 0) + 1
        self.undecided[sender] = self.undecided.get(sender, 0) + 1
        self.busy = True
        return push, None, -1

    def decided(self, sender: str) -> None:
        self.busy = False
        self.undecided[sender] -= 1

    def snapshot(self) -> dict[str, int]:
        """Each sender's pushes whose updates are decided (the numbering a new
        replica goes on from; undecided ones are sent again to a new primary).

        >>> q = UpdateQueue()
        >>> q.arrive("a", 1.0, 0, leader=True); q.arrive("a", 2.0, 1, leader=True)
        >>> _ = q.take(0); q.decided("a")
        >>> q.snapshot(), UpdateQueue.restored(q.snapshot()).arrived
        ({'a': 1}, {'a': 1})
        """
        return {s: n - self.undecided.get(s, 0) for s, n in self.arrived.items()}

    @classmethod
    def restored(cls, numbered: dict[str, int]) -> UpdateQueue:
        queue = cls()
        queue.arrived = dict(numbered)
        return queue


class UpdateQueues:
    """The :class:`UpdateQueue` of each sliced dist_async key (none in dist_sync)."""

    __slots__ = ("queues",)

    def __init__(self) -> None:
        self.queues: dict[Key, UpdateQueue] = {}

    def __contains__(self, key: object) -> bool:
        return key in self.queues

    def __getitem__(self, key: Key) -> UpdateQueue:
        return self.queues[key]

    def get(self, key: Key) -> UpdateQueue | None:
        return self.queues.get(key)

    def of(self, key: Key) -> UpdateQueue:
        """The queue of ``key``, new if it has none yet."""
        queue = self.queues.get(key)
        if queue is None:
            queue = self.queues[key] = UpdateQueue()
        return queue

    def clear(self) -> None:
        self.queues.clear()

    def snapshot(self) -> dict[Key, dict[str, int]]:
        return {k: q.snapshot() for k, q in self.queues.items()}

    def restore(self, snap: dict[Key, dict[str, int]]) -> None:
        for key, numbered in snap.items():
            self.queues[key] = UpdateQueue.restored(numbered)
