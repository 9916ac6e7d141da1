"""A server's settings: its updater or optimizer and the optimizer's states
(:class:`ShardSettings`), and the rules for who may set them.

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
"""

from __future__ import annotations

import pickle
from typing import Any

from ..._types import Key
from ...optimizers import Optimizer
from ...shard import Shard
from .._device import host_copy
from .._errors import ClusterError
from .._protocol.messages import States


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


class ShardSettings:
    """The updater or optimizer of server ``sid``'s shard and the optimizer's
    states, as the ranks set them (by the rules of the module doc)."""

    def __init__(self, sid: int, shard: Shard) -> None:
        self.sid, self.shard = sid, shard

    def set_updater(self, updater: bytes | None, owner: bool, call_id: tuple | None) -> None:
        if first_time(self.shard, call_id):
            settle_updater(self.shard, None if updater is None else pickle.loads(updater), owner)
            taken(self.shard, call_id)

    def set_optimizer(
        self, config: dict[str, Any], owner: bool, rank: int, call_id: tuple | None
    ) -> None:
        if first_time(self.shard, call_id):
            settle_optimizer(self.shard, Optimizer.from_config(config), owner, rank)
            taken(self.shard, call_id)

    def controls(self) -> dict[str, Any]:
        """The settings' control methods by name (a backup takes them from its
        primary's log, see :class:`~labkv.cluster._protocol.entries.Control`)."""
        return {
            "set_updater": self.set_updater,
            "set_optimizer": self.set_optimizer,
            "set_states": self.set_states,
        }

    def get_states(self) -> States:
        """``(num_update, per-key update counts, per-key state pieces)``."""
        num_update, counts, states = self._optimized().export_states()
        host = {k: tuple(host_copy(a) for a in st) for k, st in states.items()}
        return States(num_update, counts, host)

    def set_states(self, num_update: int, counts: dict[Key, int], states: dict[Key, tuple]) -> None:
        self._optimized().import_states(num_update, counts, states)

    def _optimized(self) -> Shard:
        if self.shard.optimizer is None:
            raise ClusterError(f"server {self.sid} has no optimizer")
        return self.shard


class Fences:
    """The senders server ``sid`` refuses, by prefix: the ranks of a stopped run
    (interrupted, or a rank failed; a rank's sender starts with its run's
    barrier group), and a lost rank's old incarnation (``<group>/<rank>.<n>/``),
    fenced when a replacement takes its place, so that a rank declared lost
    that still runs (frozen, cut off) changes nothing any more.

    >>> fences = Fences(0)
    >>> fences.bar("run-a/1.0/", "that was replaced"); fences.check("run-a/1.1/x", 1)
    >>> fences.check("run-a/1.0/x", 1)
    Traceback (most recent call last):
    ...
    labkv.cluster._errors.ClusterError: server 0 refuses rank 1 that was replaced: it may not change the store any more
    """

    __slots__ = ("sid", "barred", "why")

    def __init__(self, sid: int) -> None:
        self.sid = sid
        self.barred: tuple[str, ...] = ()
        self.why: dict[str, str] = {}

    def bar(
        self, prefix: str, why: str = "of a run that was stopped (interrupted, or a rank failed)"
    ) -> None:
        if prefix not in self.barred:
            self.barred = (*self.barred, prefix)
            self.why[prefix] = why

    def snapshot(self) -> tuple[tuple[str, ...], dict[str, str]]:
        """What a new replica takes: the prefixes barred and why."""
        return self.barred, dict(self.why)

    def restore(self, snap: tuple[tuple[str, ...], dict[str, str]]) -> None:
        self.barred, self.why = tuple(snap[0]), dict(snap[1])

    def check(self, sender: str, rank: int | None) -> None:
        """Raise what a refused sender (rank ``rank``) gets."""
        if self.barred and sender.startswith(self.barred):
            why = next(self.why[p] for p in self.barred if sender.startswith(p))
            who = "a rank" if rank is None else f"rank {rank}"
            raise ClusterError(
                f"server {self.sid} refuses {who} {why}: it may not change the store any more"
            )


def go_on_without(server: Any, prefix: str, rank: int, run: str) -> None:
    """``server`` refuses the lost rank ``rank`` (its senders start with
    ``prefix``) and goes on without it (``on_rank_loss="shrink"``): run
    ``run``'s barriers pass without it, no dist_ssp pull waits for its clocks,
    and a sliced update of its that never reached every server commits on none."""
    server.fences.bar(prefix, "that was lost: the run goes on without it")
    server.barriers.drop(run, rank)
    if server.clocks is not None:
        server.clocks.drop(rank)
    server.updates.dropped(prefix)
    server.waiting.wake()
