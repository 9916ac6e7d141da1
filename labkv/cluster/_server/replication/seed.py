"""Seeding a replica with the whole state of another: its values, optimizer
or updater, keys, rounds, votes, clocks, barriers, step marks, fences and the
senders' sequence numbers, so that every entry issued after the snapshot is
forwarded to it and none before is needed.

The state travels as one :class:`ServerSnapshot`, each part taken from and
restored into the object that holds it (``snapshot()`` / ``restore()``), with
:class:`ShardSnapshot` for the :class:`~labkv.shard.Shard`. Everything in it
pickles; what may hold a notebook's class (an updater, its errors) is
cloudpickled inside, as Dask would not know to.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import cloudpickle
import numpy as np

from ...._types import Key
from ....devices import Device, to_device
from ....optimizers import Optimizer
from ....shard import Shard
from ..._device import host_copy
from ..._event_relay import EventStream
from ..._protocol.messages import Peer
from ..._transport.base import Host
from .group import Group
from .replica_log import LogSnapshot, ReplicaLog
from .step_marks import StepMarks, StepsSnapshot

if TYPE_CHECKING:
    from ..key_table import KeysSnapshot
    from ..rounds import RoundsSnapshot
    from ..ssp_clocks import ClocksSnapshot
    from .ports import (
        BarriersPort,
        FencesPort,
        KeptVotesPort,
        KeyTablePort,
        ModePort,
        PeersPort,
        RoundsPort,
        SenderOrderPort,
        UpdateQueuesPort,
        UpdatesPort,
    )


@dataclass
class ShardSnapshot:
    """A shard's values (host copies) and its settings: the optimizer's config
    and states, or the cloudpickled updater; ``provisional``: set by a
    non-owner (the owner's equal optimizer keeps it)."""

    values: dict[Key, np.ndarray]
    optimizer: dict | None
    states: tuple | None
    updater: bytes | None
    provisional: bool
    last_setting: dict[str, str]

    @classmethod
    def of(cls, shard: Shard) -> ShardSnapshot:
        optimizer = None if shard.optimizer is None else shard.optimizer.to_config()
        states = None
        if optimizer is not None:
            num_update, counts, per_key = shard.export_states()
            states = (num_update, counts, {k: tuple(map(host_copy, s)) for k, s in per_key.items()})
        updater = None if shard.updater is None else cloudpickle.dumps(shard.updater)
        values = {k: host_copy(v) for k, v in shard.values.items()}
        return cls(values, optimizer, states, updater, shard.provisional, dict(shard.last_setting))

    def restore(self, shard: Shard, device: Device) -> None:
        """Put this state into ``shard``, its values on ``device``."""
        values = {k: to_device(np.asarray(v), device) for k, v in self.values.items()}
        shard.take(values, self.last_setting)
        if self.optimizer is not None:
            shard.set_optimizer(Optimizer.from_config(self.optimizer), self.provisional)
            shard.import_states(*self.states)
        elif self.updater is not None:
            shard.set_updater(pickle.loads(self.updater), self.provisional)


@dataclass
class ServerSnapshot:
    """The whole state of a replica (see module doc)."""

    log: LogSnapshot
    shard: ShardSnapshot
    keys: KeysSnapshot
    rounds: RoundsSnapshot
    senders: dict[str, int]
    peers: list[tuple[str, str]]
    votes: bytes
    queues: dict[Key, dict[str, int]]
    mode: ClocksSnapshot | None
    steps: StepsSnapshot
    barriers: tuple[dict, dict, dict]
    fences: tuple[tuple[str, ...], dict[str, str]]
    dropped: tuple[str, ...]  # the senders sliced updates go on without
    streaming: tuple[float, int] | None  # while watched: a new replica streams as this one


class Seeding:
    """Snapshots of server ``sid``'s parts, sent to a new (or surviving) replica
    and restored there."""

    def __init__(
        self,
        sid: int,
        device: Device,
        host: Host,
        shard: Shard,
        table: KeyTablePort,
        rounds: RoundsPort,
        senders: SenderOrderPort,
        peers: PeersPort,
        kept: KeptVotesPort,
        queues: UpdateQueuesPort,
        log: ReplicaLog,
        mode: ModePort,
        marks: StepMarks,
        barriers: BarriersPort,
        fences: FencesPort,
        updates: UpdatesPort,
        stream: EventStream,
    ) -> None:
        self.sid, self.device, self.host, self.marks = sid, device, host, marks
        self.stream = stream
        self.barriers, self.fences, self.updates = barriers, fences, updates
        self.shard, self.table, self.rounds, self.senders = shard, table, rounds, senders
        self.peers, self.kept, self.queues, self.log, self.mode = peers, kept, queues, log, mode

    def snapshot(self) -> ServerSnapshot:
        return ServerSnapshot(
            log=self.log.snapshot(),
            shard=ShardSnapshot.of(self.shard),
            keys=self.table.snapshot(),
            rounds=self.rounds.snapshot(),
            senders=self.senders.snapshot(),
            peers=self.peers.snapshot(),
            votes=self.kept.snapshot(),
            queues=self.queues.snapshot(),
            mode=self.mode.snapshot(),
            steps=self.marks.snapshot(waiting=self.rounds.waiting()),
            barriers=self.barriers.snapshot(),
            fences=self.fences.snapshot(),
            dropped=self.updates.gone,
            streaming=self.stream.settings,
        )

    def restore(self, snap: ServerSnapshot) -> None:
        snap.shard.restore(self.shard, self.device)
        self.table.restore(snap.keys)
        self.rounds.restore(snap.rounds, self.sid)
        self.log.restore(snap.log)
        self.senders.restore(snap.senders)
        self.peers.link(snap.peers)
        self.kept.restore(snap.votes)
        self.queues.restore(snap.queues)
        self.mode.restore(snap.mode)
        self.marks.restore(snap.steps, self.device)
        self.barriers.restore(snap.barriers)
        self.fences.restore(snap.fences)
        self.updates.gone = tuple(snap.dropped)
        if snap.streaming is not None:  # watched: its near reads' events (see ReplicaLog.streams)
            self.stream.start(*snap.streaming)

    async def seed(self, peer: tuple[str, str]) -> None:
        """Send this replica's whole state to ``peer``: every update issued
        before the snapshot is in it, every one after is forwarded to it. A
        replica that cannot take it leaves the group."""
        peer = Peer._make(peer)
        try:
            await self.host.call_peer(peer, "seed", [self.snapshot()])
        except Exception:
            self.log.group.drop([peer])
        self.log.regrouped()  # every backup learns the group (and its epoch) as it is now


def join(server: Any, group: Group, seeded: bool) -> tuple[ReplicaLog, Seeding]:
    """The replica log and the seeding of ``server`` (a ``Server``) once it is
    a member of ``group`` (``seeded=False``: new, it takes no entry before its seed)."""
    s = server
    state = (s.device, s.shard, s.rounds, s.senders, s.effects, s.kept)
    log = ReplicaLog(group, seeded, *state, s.waiting, s.host, s.tasks, s.reports, s.marks)
    s.effects.controls["group"] = log.group.rejoin  # see ReplicaLog.regrouped
    state = (s.shard, s.table, s.rounds, s.senders, s.peers, s.kept)
    parts = (s.queues, log, s.mode, s.marks, s.barriers, s.fences, s.updates, s.stream)
    return log, Seeding(s.sid, s.device, s.host, *state, *parts)
