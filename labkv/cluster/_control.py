"""A server's control methods: updaters, optimizers and their states, run
control (ranks, abort), and reads that never wait (peek, summary).

A mixin of :class:`~._server.Server`.
"""

from __future__ import annotations

import pickle
from typing import Any

from ..events import summarize
from ..optimizers import Optimizer
from ._device import host_copy
from ._errors import ClusterError, answered
from ._wire import Peer, States

Key = int | str


class ServerControl:
    """Settings and run control of a server (see module doc)."""

    @answered
    async def set_updater(self, updater: bytes | None) -> None:
        """Use the pickled custom ``updater`` (None: back to ASSIGN)."""
        self.shard.set_updater(None if updater is None else pickle.loads(updater))

    @answered
    async def link(self, peers: list[tuple[str, str]]) -> None:
        """Every server of the store as ``(worker address, actor key)``, by server id."""
        self.peers = [Peer._make(p) for p in peers]

    @answered
    async def set_optimizer(self, config: dict[str, Any]) -> None:
        self.shard.set_optimizer(Optimizer.from_config(config))

    @answered
    async def get_states(self) -> States:
        """``(num_update, per-key update counts, per-key state pieces)``."""
        if self.shard.optimizer is None:
            raise ClusterError(f"server {self.sid} has no optimizer")
        num_update, counts, states = self.shard.export_states()
        host = {k: tuple(host_copy(a) for a in st) for k, st in states.items()}
        return States(num_update, counts, host)

    @answered
    async def set_states(
        self, num_update: int, counts: dict[Key, int], states: dict[Key, tuple]
    ) -> None:
        if self.shard.optimizer is None:
            raise ClusterError(f"server {self.sid} has no optimizer")
        self.shard.import_states(num_update, counts, states)

    @answered
    async def configure(self, num_workers: int) -> None:
        """Set the number of ranks a dist_sync round waits for (no round may be open)."""
        try:
            self.rounds.resize(num_workers)
        except ValueError as exc:
            raise ClusterError(f"server {self.sid}: {exc}") from None
        if self.clocks is not None:
            self.clocks.reset(num_workers)
        self.waiting.aborted = None

    @answered
    async def abort(self, reason: str) -> None:
        """Wake every waiter with ``ClusterError(reason)`` and drop open rounds."""
        self.rounds.drop_open()
        self._prepared.clear()
        self._votes.clear()
        self.queues.clear()
        self.waiting.abort(reason)

    @answered
    async def peek(self, keys: list[Key]) -> list[Any]:
        """Copies of the stored pieces as they are now: no waiting for rounds or
        for in-flight pushes, no events (what a monitor draws)."""
        return [host_copy(self.shard.read(k)) for k in keys]

    @answered
    async def summary(self, key: Key) -> dict[str, float]:
        """min/max/mean/norm of a stored piece (for checks without moving it)."""
        return summarize(self.shard.read(key))
