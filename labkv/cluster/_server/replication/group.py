"""Replicated servers, the group's changes: who the replicas are, promotion of a
backup after the primary is lost, a new replica added, and seeding a replica
with the whole state of another (its values, optimizer or updater, rounds and
the senders' sequence numbers), so that every entry issued after the snapshot
is forwarded to it and none before is needed.

The base of :class:`~labkv.cluster._server.replication.log.Replication` (a mixin of
:class:`~labkv.cluster._server.actor.Server`).
"""

from __future__ import annotations

import pickle
from typing import Any

import cloudpickle
import numpy as np

from ....devices import to_device
from ....optimizers import Optimizer
from ..._device import host_copy
from ..._errors import answered
from ..._protocol.messages import Peer
from ..order import UpdateQueue
from ..rounds import Failure

__all__ = ["Membership"]


class Membership:
    """Joining, promoting, adding and seeding replicas (see module doc)."""

    @answered
    async def join_group(
        self, members: list[tuple[str, str]], me: int, seeded: bool = True
    ) -> None:
        """This server is replica ``me`` of ``members`` (primary first); a new
        replica (``seeded=False``) waits for :meth:`seed` before any entry."""
        self._start_group(members, me, seeded)

    @answered
    async def members(self) -> tuple[int, list[tuple[str, str]]]:
        """``(epoch, replicas as (address, actor key), primary first)``."""
        return self.epoch, [tuple(m) for m in self.group]

    @answered
    async def promote(self, lost: list[tuple[str, str]]) -> tuple[int, list[tuple[str, str]]]:
        """Become the primary: the replicas in ``lost`` are gone (every one before
        this one in the group must be). Idempotent: ranks that see the loss at
        once promote the same replica. The surviving backups are re-seeded from
        this one (they may have applied an entry this one has not)."""
        gone = {Peer._make(p) for p in lost}
        if not self.primary:
            ahead = self.group[: self.group.index(self.me)]
            missing = [m.address for m in ahead if m not in gone]
            if missing:
                raise RuntimeError(f"replicas {missing} come first and are not known to be lost")
            self.group = [m for m in self.group if m not in gone]
            self.acked = self.issued
            self.epoch += 1
            self._wake()  # an entry of the old primary waiting here is refused now
            self._announce_promotion()
            for backup in list(self.group[1:]):
                await self._seed_one(backup)
        return await self.members()

    @answered
    async def add_replica(self, peer: tuple[str, str]) -> tuple[int, list[tuple[str, str]]]:
        """Seed the new replica ``peer`` from this primary and forward it every
        update from now on."""
        peer = Peer._make(peer)
        if peer not in self.group:
            self.group.append(peer)
            self.epoch += 1
            await self._seed_one(peer)
        return await self.members()

    async def _seed_one(self, peer: Peer) -> None:
        """Send this replica's whole state to ``peer``: every update issued
        before the snapshot is in it, every one after is forwarded to it."""
        try:
            await self.host.call_peer(peer, "seed", [self._snapshot()])
        except Exception:
            self.group = [m for m in self.group if m != peer]
            self.epoch += 1

    def _snapshot(self) -> dict[str, Any]:
        shard = self.shard
        optimizer = None if shard.optimizer is None else shard.optimizer.to_config()
        states = shard.export_states() if optimizer is not None else None
        if states is not None:
            states = (
                states[0],
                states[1],
                {k: tuple(map(host_copy, s)) for k, s in states[2].items()},
            )
        return {
            "index": self.issued,
            "group": [tuple(m) for m in self.group],
            "epoch": self.epoch,
            "values": {k: host_copy(v) for k, v in shard.values.items()},
            "meta": dict(self.meta),
            "first_piece": dict(self.first_piece),
            "sliced": set(self.sliced),
            "done": {k: r.done for k, r in self.rounds.rounds.items()},
            "num_workers": self.num_workers,
            "optimizer": optimizer,
            "states": states,
            "updater": None if shard.updater is None else cloudpickle.dumps(shard.updater),
            "provisional": shard.provisional,  # set by a non-owner: the owner's equal one keeps it
            "last_setting": dict(shard.last_setting),
            "next_seq": dict(self.next_seq),
            "applied_seq": dict(self.applied_seq),
            "failures": self._owed_failures(),
            "peers": [tuple(p) for p in self.peers],
            "clocks": None if self.clocks is None else dict(self.clocks.clocks),
            "rank_of": dict(self.rank_of),
            "my_votes": cloudpickle.dumps(self._my_votes),  # errors of a notebook's class
            # dist_async sliced keys: each sender's pushes whose updates are issued
            "numbered": {
                k: {s: n - q.undecided.get(s, 0) for s, n in q.arrived.items()}
                for k, q in self.queues.items()
            },
        }

    def _owed_failures(self) -> bytes:
        """The failed dist_sync rounds still owed to some rank, cloudpickled (an
        updater's error may be of a notebook's class): each failure once, with
        the ``(key, round)`` of each round it failed (one failure may close the
        rounds of several keys, and a rank told of it is told for all)."""
        failures: dict[int, tuple[Failure, list]] = {}
        for key, r in self.rounds.rounds.items():
            for g, failure in r.failures.items():
                failures.setdefault(id(failure), (failure, []))[1].append((key, g))
        return cloudpickle.dumps(
            [(f.error, f.keys, f.untold, rounds) for f, rounds in failures.values()]
        )

    @answered
    async def seed(self, snap: dict[str, Any]) -> None:
        """Take the primary's state (see :meth:`_snapshot`)."""
        shard = self.shard
        shard.values = {k: to_device(np.asarray(v), self.device) for k, v in snap["values"].items()}
        self.meta, self.first_piece = dict(snap["meta"]), dict(snap["first_piece"])
        self.sliced = set(snap["sliced"])
        self.rounds.num_workers = snap["num_workers"]
        for key, done in snap["done"].items():
            self.rounds.add(key)
            self.rounds[key].done = done
        provisional, shard.last_setting = snap["provisional"], dict(snap["last_setting"])
        if snap["optimizer"] is not None:
            shard.set_optimizer(Optimizer.from_config(snap["optimizer"]), provisional)
            shard.import_states(*snap["states"])
        elif snap["updater"] is not None:
            shard.set_updater(pickle.loads(snap["updater"]), provisional)
        members = [Peer._make(m) for m in snap["group"]]
        self._start_group(members, members.index(self.me))
        self.issued = self.acked = snap["index"]
        self.epoch = snap["epoch"]
        self.next_seq, self.applied_seq = dict(snap["next_seq"]), dict(snap["applied_seq"])
        self.peers = [Peer._make(p) for p in snap["peers"]]
        if snap["clocks"] is not None:
            self.clocks.clocks = {k: list(row) for k, row in snap["clocks"].items()}
        self.rank_of = dict(snap["rank_of"])
        self._my_votes = pickle.loads(snap["my_votes"])
        for key, numbered in snap["numbered"].items():
            self.queues[key] = UpdateQueue()
            self.queues[key].arrived = dict(numbered)
        for error, keys, untold, rounds in pickle.loads(snap["failures"]):
            failure = Failure(error, self.sid, keys, untold)
            for key, g in rounds:
                self.rounds[key].failures[g] = failure
        self._wake()
