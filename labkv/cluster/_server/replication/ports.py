"""What replication needs of the server's parts, as narrow interfaces.

The replica log, its notes, near reads and seeding act on a server's parts (its
rounds, its senders' order, its kept votes, its waiters, barriers, reports, mode,
key table, clocks, peers, update queues, fences and updates). They name them by
these protocols only, never by the classes that implement them, so no module of
``replication/`` imports another module of ``_server/`` at run time: the parts
hold the log, and the log knows only the few members listed here. Each
protocol's concrete part (``SyncRounds`` for :class:`RoundsPort`, ``Server`` for
:class:`ServerPort`, and so on) has every member with the same parameters,
checked by ``tests/test_cluster_replication_ports.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from typing import TYPE_CHECKING, Any, Protocol

from ...._types import Key

if TYPE_CHECKING:
    from ..._errors import Failure
    from ..._protocol.entries import Vote

#: What finishes a key's open round (its update applied, or failed as the ``Failure``).
Finish = Callable[[Any, "Failure | None"], None]


class RoundPort(Protocol):
    """One key's open round (``Round``)."""

    senders: dict[str, int]
    issued: bool
    done: int
    pending: Any

    def report_to(self, sender: str) -> BaseException | None: ...


class RoundsPort(Protocol):
    """The dist_sync rounds of every key (``SyncRounds``)."""

    joined: Any

    def __getitem__(self, key: Any) -> RoundPort: ...
    def snapshot(self) -> Any: ...
    def restore(self, snap: Any, server: int) -> None: ...
    def waiting(self) -> list[tuple[Any, int]]: ...


class SenderOrderPort(Protocol):
    """Each sender's next push, in order (``SenderOrder``)."""

    def next(self, sender: str) -> int: ...
    def passed(self, sender: str, seq: int) -> None: ...
    def snapshot(self) -> dict[str, int]: ...
    def restore(self, snap: dict[str, int]) -> None: ...


class UpdateQueuesPort(Protocol):
    """The queues of sliced updates (``UpdateQueues``)."""

    def snapshot(self) -> dict[Key, dict[str, int]]: ...
    def restore(self, snap: dict[Key, dict[str, int]]) -> None: ...


class KeptVotesPort(Protocol):
    """Server 0's votes, kept for a replica (``KeptVotes``)."""

    def keep(self, vote: Vote) -> None: ...
    def snapshot(self) -> bytes: ...
    def restore(self, snap: bytes) -> None: ...


class PeersPort(Protocol):
    """The other servers of the store (``Peers``)."""

    def link(self, peers: list[tuple[str, str]]) -> None: ...
    def snapshot(self) -> list[tuple[str, str]]: ...


class UpdatesPort(Protocol):
    """Sliced updates (``Updates``): the senders the run goes on without."""

    gone: tuple[str, ...]


class WaitersPort(Protocol):
    """What waits for the server's state to change (``Waiters``)."""

    async def until(self, ready: Callable[[], bool], missing: Callable[[], str]) -> None: ...
    def wake(self) -> None: ...


class BarriersPort(Protocol):
    """The barriers' generations (``Barriers``)."""

    def told_everyone(self, group: str, generation: Any, backups: set[str]) -> bool: ...
    def passed_on_primary(self, group: str, generation: Any) -> None: ...
    def snapshot(self) -> tuple[dict, dict, dict]: ...
    def restore(self, snap: tuple[dict, dict, dict]) -> None: ...


class ReportsPort(Protocol):
    """The server's counters and events (``Reports``)."""

    messages: Any

    def backup_lost(self, lost: list[Any], members: list[Any]) -> None: ...


class ModePort(Protocol):
    """dist_sync, dist_async or dist_ssp (``SyncMode`` and its siblings);
    ``sync``: whether a round holds every rank's push of a key."""

    sync: bool

    def lowest_open(self, sender: str, low: int) -> int: ...
    def outside_open_rounds(self, sender: str, seq: int, items: list) -> list: ...
    async def readable(
        self, sender: str, keys: list[Key], rank: int | None = None, step: int | None = None
    ) -> Set[Key]: ...
    def values(
        self, keys: list[Key], own: Set[Key], before: dict | None = None, rows: dict | None = None
    ) -> tuple | bytes: ...
    def snapshot(self) -> Any: ...
    def restore(self, snap: Any) -> None: ...


class KeyTablePort(Protocol):
    """The keys the server holds (``KeyTable``)."""

    def __contains__(self, key: object) -> bool: ...
    def snapshot(self) -> Any: ...
    def restore(self, snap: Any) -> None: ...


class ClocksPort(Protocol):
    """dist_ssp's clocks (``Clocks``)."""

    def pushed(self, sender: str, rank: int, keys: list[Any]) -> None: ...


class FencesPort(Protocol):
    """The fences of stopped runs and dropped senders (``Fences``)."""

    def check(self, sender: str, rank: int | None) -> None: ...
    def snapshot(self) -> tuple[tuple[str, ...], dict[str, str]]: ...
    def restore(self, snap: tuple[tuple[str, ...], dict[str, str]]) -> None: ...


class ServerPort(Protocol):
    """A server (``Server``), as near reads and joining a group see it."""

    sid: int
    device: Any
    host: Any
    tasks: Any
    shard: Any
    stream: Any
    effects: Any
    marks: Any
    log: Any
    table: KeyTablePort
    rounds: RoundsPort
    senders: SenderOrderPort
    kept: KeptVotesPort
    peers: PeersPort
    queues: UpdateQueuesPort
    updates: UpdatesPort
    waiting: WaitersPort
    barriers: BarriersPort
    reports: ReportsPort
    mode: ModePort
    clocks: ClocksPort | None
    fences: FencesPort
