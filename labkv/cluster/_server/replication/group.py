"""Replicated servers, the group: who the replicas of one server id are
(primary first), and the epoch that counts the group's changes (a backup
lost, a backup promoted after the primary is lost, a replica added).

>>> a, b, c = (Peer("w", name) for name in "abc")
>>> group = Group([a, b], me=1)
>>> group.primary
False
>>> group.take_over({a}); group.primary, group.listed()
(True, (1, [('w', 'b')]))
>>> group.add(c), group.add(c), group.backups
(True, False, [Peer(address='w', actor_key='c')])
"""

from __future__ import annotations

from collections.abc import Iterable

from ..._protocol.messages import Peer


class Group:
    """The replicas of one server id as replica ``me`` of ``members`` sees them."""

    __slots__ = ("members", "me", "epoch")

    def __init__(self, members: list[tuple[str, str]], me: int) -> None:
        self.members = [Peer._make(m) for m in members]
        self.me = self.members[me]
        self.epoch = 0

    @property
    def primary(self) -> bool:
        return self.members[0] == self.me

    @property
    def backups(self) -> list[Peer]:
        return self.members[1:]

    def listed(self) -> tuple[int, list[tuple[str, str]]]:
        """``(epoch, replicas as (address, actor key), primary first)``."""
        return self.epoch, [tuple(m) for m in self.members]

    def drop(self, lost: Iterable[Peer]) -> None:
        """The replicas in ``lost`` are gone."""
        lost = set(lost)
        self.members = [m for m in self.members if m not in lost]
        self.epoch += 1

    def add(self, peer: tuple[str, str]) -> bool:
        """A new replica (last); whether it is new to the group."""
        peer = Peer._make(peer)
        if peer in self.members:
            return False
        self.members.append(peer)
        self.epoch += 1
        return True

    def take_over(self, gone: set[Peer]) -> None:
        """This replica becomes the primary: the replicas in ``gone`` are lost
        (every one before it in the group must be)."""
        ahead = self.members[: self.members.index(self.me)]
        missing = [m.address for m in ahead if m not in gone]
        if missing:
            raise RuntimeError(f"replicas {missing} come first and are not known to be lost")
        self.drop(gone)

    def rejoin(self, members: list[tuple[str, str]], epoch: int) -> None:
        """The group as the primary that seeds this replica sees it."""
        members = [Peer._make(m) for m in members]
        members.index(self.me)  # this replica must be one of them
        self.members, self.epoch = members, epoch
