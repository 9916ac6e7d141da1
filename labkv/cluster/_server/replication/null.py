"""The log of a server without replicas (``replicas=1``): the no-op twin of
:class:`~labkv.cluster._server.replication.replica_log.ReplicaLog`, with the same
methods, so that the push, pull and update paths never ask whether a server
has replicas.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...._types import Key
from ....shard import Shard
from ..._protocol.entries import Clock, Vote
from ..._protocol.messages import Peer
from .notes import NoteEffects

if TYPE_CHECKING:
    from ..._errors import Failure
    from .ports import Finish, ModePort


class NullLog:
    """The log of a server without replicas: nothing is forwarded, every update
    is acknowledged at once, replies are the payload alone."""

    primary = True
    seeded = True  # it holds its whole state
    backups: tuple[Peer, ...] = ()
    issued = 0  # entries: nothing is logged

    def __init__(self, shard: Shard, effects: NoteEffects) -> None:
        self.shard, self.effects = shard, effects

    def fresh(self, sender: str, seq: int, items: list, mode: ModePort) -> list:
        return items  # no resends without a failover

    def issue_push(
        self, sender: str, seq: int, items: list, note: Clock | None, marks: list | None = None
    ) -> None:
        self.shard.apply([(k, [v]) for k, v in items])

    def after_push(self, note: Clock, sender: str, seq: int, keys: list[Key]) -> None:
        """Nothing carries a push's note: it takes effect when the push is over."""
        self.effects.clocked(sender, note.rank, keys)

    def rounds_done(
        self,
        keys: list[Key],
        failure: Failure | None,
        told: str | None,
        pushes: list[tuple] | None,
        finish: Finish,
    ) -> None:
        for key in keys:
            finish(key, failure)

    def vote(self, vote: Vote, send: Callable[[], None]) -> None:
        send()

    def told(self, sender: str, keys: list[Key]) -> None:
        pass

    def barrier_passed(self, group: str, generation: Any, barriers: Any) -> None:
        pass

    async def control(self, method: str, *args: Any) -> None:
        pass  # no backups to tell

    async def replicated(self) -> None:
        pass

    def reply(self, sender: str, payload: Any, mode: ModePort) -> Any:
        return payload

    def load(self) -> dict[str, Any]:
        return {}

    def streams(self, event: Any) -> bool:
        return True
