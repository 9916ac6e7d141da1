"""The order in which the servers of a sliced dist_async key apply its updates.

Every server of a sliced key with a custom updater applies that key's pushes
in the order server 0 received them (server 0 names the next push in its
vote), so that all slices update together or not at all.
"""

from __future__ import annotations

from typing import Any


class UpdateQueue:
    """dist_async updates of one sliced key on one server, applied in the order
    server 0 received them (every server of the key follows that order, so the
    slices of each update commit together; see ``Server._advance``).

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

    def decided(self, sender: str) -> None:
        self.busy = False
        self.undecided[sender] -= 1
