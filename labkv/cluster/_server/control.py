"""A server's control methods: updaters, optimizers and their states, run
control (ranks, abort), and reads that never wait (peek, summary).

Every rank ships its updater or optimizer, saying whether it owns the store
(rank 0 of a run, or the notebook that shares its store with a run). On a
server (:func:`settle_optimizer`, :func:`settle_updater`):

- the owner's replaces what is there (an optimizer's states start fresh),
  except an equal optimizer set by a non-owner, which is kept with its states;
- a non-owner's takes effect only where nothing is set yet (it is then
  *provisional*, see :attr:`labkv.shard.Shard.provisional`);
- a non-owner's optimizer that differs from the one there raises
  ``ValueError`` and changes nothing; an equal one changes nothing;
- a non-owner's updater where one is set is ignored: pickled code cannot be
  compared.

A setting carries a call id ``(sender, token)``: a call made again after a
failover, which may have reached this replica already, is taken once
(:func:`first_time`).

A mixin of :class:`~labkv.cluster._server.actor.Server`.
"""

from __future__ import annotations

import pickle
from typing import Any

from ...events import summarize
from ...optimizers import Optimizer
from ...shard import Shard
from .._device import host_copy
from .._errors import ClusterError, answered
from .._protocol.messages import Peer, States

Key = int | str


def settle_optimizer(shard: Shard, optimizer: Optimizer, owner: bool, rank: int) -> None:
    """Apply rank ``rank``'s ``optimizer`` to ``shard`` by the rules of the
    module doc (``owner``: that rank owns the store).

    >>> from labkv.optimizers import SGD
    >>> shard = Shard()
    >>> settle_optimizer(shard, SGD(learning_rate=0.1), owner=False, rank=1)
    >>> shard.provisional
    True
    >>> settle_optimizer(shard, SGD(learning_rate=0.2), owner=False, rank=2)
    Traceback (most recent call last):
    ...
    ValueError: rank 2's optimizer sgd {'learning_rate': 0.2} differs from the one the \
servers use, sgd {'learning_rate': 0.1}: set the same optimizer on every rank
    >>> kept = shard.optimizer
    >>> settle_optimizer(shard, SGD(learning_rate=0.1), owner=True, rank=0)
    >>> shard.optimizer is kept, shard.provisional
    (True, False)
    """
    current = shard.optimizer
    same = current is not None and current.to_config() == optimizer.to_config()
    if owner:
        if not (same and shard.provisional):
            shard.set_optimizer(optimizer)
        shard.provisional = False
    elif current is None and shard.updater is None:
        shard.set_optimizer(optimizer, provisional=True)
    elif not same:
        raise ValueError(_mismatch(rank, optimizer, current))


def settle_updater(shard: Shard, updater: Any, owner: bool) -> None:
    """Apply a rank's custom ``updater`` (None: ASSIGN) to ``shard`` by the rules
    of the module doc: a non-owner's is used only where nothing is set yet.

    >>> shard = Shard()
    >>> settle_updater(shard, print, owner=False)
    >>> settle_updater(shard, repr, owner=False)  # ignored: one is set
    >>> shard.updater is print, shard.provisional
    (True, True)
    >>> settle_updater(shard, repr, owner=True)
    >>> shard.updater is repr, shard.provisional
    (True, False)
    """
    if owner:
        shard.set_updater(updater)
    elif updater is not None and shard.updater is None and shard.optimizer is None:
        shard.set_updater(updater, provisional=True)


def first_time(shard: Shard, call_id: tuple[str, str] | None) -> bool:
    """Whether the setting call ``call_id`` is new to ``shard``; it is noted as
    taken by :func:`taken` once it succeeded (a refused one raises again).

    >>> shard = Shard()
    >>> first_time(shard, ("rank-a", "1"))
    True
    >>> taken(shard, ("rank-a", "1")); first_time(shard, ("rank-a", "1"))
    False
    """
    return call_id is None or shard.last_setting.get(call_id[0]) != call_id[1]


def taken(shard: Shard, call_id: tuple[str, str] | None) -> None:
    """Note the setting call ``call_id`` as taken by ``shard``."""
    if call_id is not None:
        shard.last_setting[call_id[0]] = call_id[1]


def _flat(config: dict[str, Any]) -> dict[str, Any]:
    return {**config["params"], "lr_scheduler": config["lr_scheduler"]}


def _mismatch(rank: int, optimizer: Optimizer, current: Optimizer | None) -> str:
    """Why rank ``rank``'s ``optimizer`` is refused: what differs from ``current``."""
    mine = optimizer.to_config()
    if current is None:
        theirs = "a custom updater"
        shown = _flat(mine)
    else:
        used = current.to_config()
        a, b = _flat(mine), _flat(used)
        keys = [k for k in {**a, **b} if a.get(k) != b.get(k)]
        shown, used_shown = {k: a.get(k) for k in keys}, {k: b.get(k) for k in keys}
        theirs = f"the one the servers use, {used['name']} {used_shown}"
    return (
        f"rank {rank}'s optimizer {mine['name']} {shown} differs from {theirs}: "
        "set the same optimizer on every rank"
    )


class ServerControl:
    """Settings and run control of a server (see module doc)."""

    @answered
    async def set_updater(
        self, updater: bytes | None, owner: bool = True, call_id: tuple[str, str] | None = None
    ) -> None:
        """Use the pickled custom ``updater`` (None: back to ASSIGN); ``owner``:
        it comes from the store's owner (see the module doc)."""
        if first_time(self.shard, call_id):
            settle_updater(self.shard, None if updater is None else pickle.loads(updater), owner)
            taken(self.shard, call_id)

    @answered
    async def link(self, peers: list[tuple[str, str]]) -> None:
        """Every server of the store as ``(worker address, actor key)``, by server id."""
        self.peers = [Peer._make(p) for p in peers]

    @answered
    async def set_optimizer(
        self,
        config: dict[str, Any],
        owner: bool = True,
        rank: int = 0,
        call_id: tuple[str, str] | None = None,
    ) -> None:
        """Use the optimizer of ``config`` (``to_config()``), set by rank
        ``rank`` (``owner``: the store's owner; see the module doc)."""
        if first_time(self.shard, call_id):
            settle_optimizer(self.shard, Optimizer.from_config(config), owner, rank)
            taken(self.shard, call_id)

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
    async def abort(self, reason: str, run: str | None = None) -> None:
        """Wake every waiter with ``ClusterError(reason)`` and drop open rounds;
        ``run``: the barrier group of the run stopped, whose ranks' pushes and
        pulls are refused from now on (the ranks of a stopped run that still
        execute must not change a shared store)."""
        if run is not None and f"{run}/" not in self.barred:
            self.barred = (*self.barred, f"{run}/")
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
