"""A server shard: one Dask actor holding its keys in a :class:`~labkv.shard.Shard`.

:class:`Server` is the actor's object and nothing else: each remote method (called on a stream,
:mod:`labkv.cluster._transport.stream`, or as an actor call) decodes, hands over to the part that
holds the rule (built in ``__init__``; what a push and a pull do: the mode, :mod:`.modes`), and
replies.

Every method is ``async def`` and runs on the worker's event loop: a wait (another rank's push, a
barrier) is an ``await``, and the loop serves other calls meanwhile (a blocking method would stall
every shard of the worker, and two shards waiting for each other's rounds would deadlock). Update
arithmetic (``Shard.apply``) runs inline on the loop: it is short.
"""

from __future__ import annotations

import functools
from collections.abc import Set
from typing import Any

from ..._types import Key
from ...events import EventBus, summarize
from ...shard import Shard, check_new_keys
from .._device import device_label, host_copy, pick_server_device, warm_up
from .._errors import ClusterError, answered
from .._event_relay import EventStream
from .._protocol.entries import decode_entry
from .._protocol.messages import InitItem, KeyMeta, Pull, Push, States, decode_pull, decode_push
from .._tasks import TaskGroup
from .._transport.base import Host
from .control import Fences, ShardSettings, first_time, go_on_without, taken
from .key_table import KeyTable, store_new_keys
from .modes import new_mode
from .replication.group import Group
from .replication.notes import NoteEffects
from .replication.null import NullLog
from .replication.reads import read_here
from .replication.replica_log import ReplicaLog
from .replication.seed import Seeding, ServerSnapshot, join
from .replication.step_marks import StepMarks
from .reports import Reports
from .rounds import Staging, SyncRounds
from .sender_order import SenderOrder, UpdateQueues
from .ssp_clocks import Clocks
from .updates import KeptVotes, Peers, SliceVotes, Updates
from .waiting import Barriers, Waiters


class Server:
    """The server actor (see module doc); made by :func:`labkv.cluster._runtime.launch.start_servers`."""

    sid: int = 0  # declared on the class so that remote attribute reads work
    device_name: str = "cpu(0)"

    def __init__(
        self,
        sid: int,
        store_id: str,
        num_workers: int,
        sync: bool,
        timeout: float,
        topic: str,
        device: str = "cpu",
        staleness: int | None = None,
        *,
        host: Host,
    ):
        self.device = pick_server_device(device, sid, f"Dask worker {host.address}")
        self.device_name = device_label(self.device)
        warm_up(self.device)  # first-use kernel compiles now, not inside the first push
        self.sid, self.store_id, self.topic = sid, store_id, topic
        self.address, self.host, self.bus = host.address, host, EventBus(store_id)
        self.shard, self.table = Shard(self.bus, server=sid), KeyTable(sid)
        self.rounds = SyncRounds(num_workers)
        self.waiting, self.tasks = Waiters(f"server {sid}", timeout), TaskGroup()
        self.barriers = Barriers(self.waiting)
        self.senders, self.peers = SenderOrder(self.waiting), Peers(sid, host, self.tasks)
        self.votes, self.kept, self.queues = SliceVotes(), KeptVotes(), UpdateQueues()
        self.staging, self.settings = Staging(self.device), ShardSettings(sid, self.shard)
        self.reports = Reports(sid, self.device_name, self.bus, self.shard, self.table, self.rounds)
        self.clocks = None if staleness is None else Clocks(staleness, num_workers)
        noted = (self.table, self.rounds, self.kept, self.clocks, self.barriers)
        self.effects = NoteEffects(sid, *noted)
        self.effects.controls = {"init": self._init, **self.settings.controls()}
        self.log: NullLog | ReplicaLog = NullLog(self.shard, self.effects)
        ended = self.reports.round_ended if sync else (lambda key, r: None)
        state = (self.sid, self.shard, self.table, self.rounds, self.votes, self.kept)
        self.marks = StepMarks()  # what a lost rank's replacement needs
        calls = (self.queues, self.peers, self.log, self.waiting, ended, self.marks)
        self.updates = Updates(*state, *calls)
        parts = (self.shard, self.table, self.rounds, self.reports, self.waiting, self.log)
        parts = (*parts, self.updates, self.marks)
        self.mode = new_mode(parts, sync, self.staging, self.queues, self.kept, self.clocks)
        self.seeding: Seeding | None = None  # with replicas (join_group)
        self.fences = Fences(sid)  # the senders refused for good
        publish = functools.partial(host.log_event, topic)
        self.stream = EventStream(self.bus, publish, self._load, annotate=self.reports.annotate)
        self.stream.keep = lambda event: self.log.streams(event)  # a backup: its reads' alone

    # -- what tests and the monitor read ----------------------------------------------------
    @property
    def primary(self) -> bool:
        """Whether this server is its id's primary (always, without replicas)."""
        return self.log.primary

    @property
    def meta(self) -> dict[Key, KeyMeta]:
        return self.table.meta

    # -- keys -------------------------------------------------------------------
    @answered
    async def init(self, items: list[InitItem], call_id: tuple[str, str] | None = None) -> None:
        """Store new keys, one ``InitItem`` each (a call made again, ``call_id``,
        once), here and on every backup (through the log)."""
        if self._init(items, call_id):
            await self.log.control("init", items, call_id)

    def _init(self, items: list[InitItem], call_id: tuple[str, str] | None) -> bool:
        if not first_time(self.shard, call_id):
            return False
        items = [InitItem._make(item) for item in items]
        check_new_keys([item.key for item in items], self.table)
        parts = (self.device, self.shard, self.table, self.rounds)
        added = store_new_keys(items, *parts)
        self.reports.bytes_in += added if self.log.primary else 0  # a backup's: its primary's
        taken(self.shard, call_id)
        self.waiting.wake()
        return True

    @answered
    async def keys(self, wanted: list[Key] | None = None) -> dict[Key, KeyMeta]:
        """``{key: KeyMeta}`` of the wanted keys that exist (all with None)."""
        meta = self.table.meta
        return dict(meta) if wanted is None else {k: meta[k] for k in wanted if k in meta}

    @answered
    async def wait_keys(self, wanted: list[Key]) -> dict[Key, KeyMeta]:
        """Wait until every wanted key is initialised (by rank 0); their metadata."""
        table = self.table
        await self.waiting.until(lambda: table.have(wanted), lambda: table.never(wanted))
        return {k: table.meta[k] for k in wanted}

    # -- push and pull ----------------------------------------------------------
    @answered
    async def push(self, msg: Push | tuple | bytes) -> tuple | None:
        """A :class:`~labkv.cluster._protocol.messages.Push`, the ``seq``-th of its
        sender, applied in that order as the mode says (replicated, the reply is
        ``(acked, epoch, None)``)."""
        push = decode_push(msg)
        h = push.header
        self.fences.check(h.sender, h.rank)
        self.reports.messages["push"] += 1
        await self.senders.arrived(h.sender, h.seq, f"rank {h.rank}")
        self.fences.check(h.sender, h.rank)  # fenced while it waited
        try:
            await self.mode.push(push)
        finally:
            self.senders.passed(h.sender, h.seq)
            self.waiting.wake()
        if h.big:  # the rank waits for this push: acknowledged at once
            await self.log.replicated()
        return self.log.reply(h.sender, None, self.mode)

    @answered
    async def pull(self, msg: Pull | tuple | bytes) -> tuple | bytes:
        """The encoded :class:`~labkv.cluster._protocol.messages.Values` of a
        :class:`~labkv.cluster._protocol.messages.Pull`'s keys, once what it reads
        is there (the mode says what that is), after the pushes it carries."""
        pull = decode_pull(msg)
        self.fences.check(pull.sender, pull.rank)
        if pull.pushes:
            await self._apply_carried(pull.pushes)
        self.reports.messages["pull"] += 1
        own = await self._await_readable(pull.sender, pull.seq, pull.keys, pull.rank, pull.step)
        before = None if pull.step is None else self.mode.as_of(pull.keys, pull.rank, pull.step)
        values = self.mode.values(pull.keys, own, before, pull.rows)  # rows: see _rows.server
        return self.log.reply(pull.sender, values, self.mode)

    @answered
    async def read(self, sender: str, rank: int | None, keys: list, seqs: list, rows: Any) -> tuple:
        """A pull by a rank of this backup's worker (see :mod:`.replication.reads`)."""
        return await read_here(self, sender, rank, keys, seqs, rows)

    async def _apply_carried(self, pushes: list) -> None:
        """Apply each held push (:mod:`labkv.cluster._rank.holding`) as :meth:`push`
        would, all of them even after one failed (the first error is the pull's)."""
        error = None
        for push in pushes:
            try:
                await self.push(push)
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error

    async def _await_readable(
        self, sender: str, seq: int, keys: list[Key], rank: int | None, step: int | None
    ) -> Set[Key]:
        """Wait for the sender's first ``seq`` pushes and what the mode waits for; the keys
        read in its own round. A failed update reaches each rank once (backups too)."""
        await self.senders.arrived(sender, seq, "this worker")
        own = await self.mode.readable(sender, keys, rank, step)
        for key in keys:
            failed = self.rounds[key].report_to(sender)
            if failed is not None:
                self.log.told(sender, [key])
                raise failed
        await self.log.replicated()
        return own

    # -- votes on sliced keys ---------------------------------------------------------
    @answered
    async def vote(
        self, key: Key, number: int, sid: int, error: BaseException | None, push: tuple | None
    ) -> None:
        """Server ``sid``'s outcome of its slice of update ``number`` of ``key``;
        from server 0 in dist_async, also which push that update is."""
        self.updates.received(key, number, sid, error, push)

    @answered
    async def peer_promoted(self, sid: int, peer: tuple[str, str]) -> None:
        """Server ``sid``'s new primary is ``peer`` (see ``Updates.peer_moved``)."""
        self.updates.peer_moved(sid, peer)

    # -- replicas -----------------------------------------------------------------------
    @answered
    async def join_group(
        self, members: list[tuple[str, str]], me: int, seeded: bool = True
    ) -> None:
        """Replica ``me`` of ``members`` (primary first); ``seeded=False``: new, it
        waits for :meth:`seed` before any entry. Its log is a replica log now."""
        self.log, self.seeding = join(self, Group(members, me), seeded)
        for part in (self.updates, self.mode):
            part.use(self.log)

    @answered
    async def members(self) -> tuple[int, list[tuple[str, str]]]:
        """``(epoch, replicas as (address, actor key), primary first)``."""
        return self.log.members()

    @answered
    async def promote(
        self, lost: list[tuple[str, str]]
    ) -> tuple[int, list[tuple[str, str]]] | None:
        """Become the primary, the replicas in ``lost`` gone (idempotent: ranks that
        see the loss at once promote the same replica); the surviving backups are
        re-seeded from this one (they may have applied an entry it has not). None
        from a replica not seeded yet: it has no state to go on from."""
        if not self.log.seeded:
            return None
        if self.log.promote(lost):
            self.mode.promoted()
            self.updates.announce(self.log.me)
            for backup in list(self.log.backups):
                await self.seeding.seed(backup)
        return self.log.members()

    @answered
    async def add_replica(self, peer: tuple[str, str]) -> tuple[int, list[tuple[str, str]]]:
        """Seed the new replica ``peer`` and forward it every update from now on."""
        if self.log.group.add(peer):
            await self.seeding.seed(peer)
        return self.log.members()

    @answered
    async def seed(self, snap: ServerSnapshot) -> None:
        """Take the primary's state (see :mod:`.replication.seed`)."""
        self.seeding.restore(snap)
        self.waiting.wake()

    @answered
    async def replicate(self, entry: tuple) -> None:
        """A backup applies the primary's log entry (``entries.encode_entry``) once
        every entry before it is applied."""
        entry = decode_entry(entry)
        if await self.log.receive(entry.index):
            failure = self.log.apply(entry)
            self.mode.entry_applied(entry.updates, entry.pushes, failure)
            self.log.applied(entry.index)

    @answered
    async def replay(self, sender: str, first_seq: int, pushes: list[Any]) -> tuple:
        """A new primary gets ``sender``'s unacknowledged pushes from its
        ``first_seq``-th on, in order (those applied here are skipped); the reply."""
        self.senders.skip_to(sender, first_seq)
        for push in pushes:
            await self.push(push)
        await self.log.replicated()
        return self.log.reply(sender, None, self.mode)

    # -- settings (rules in .control) ---------------------------------------------------
    @answered
    async def set_updater(
        self, updater: bytes | None, owner: bool = True, call_id: tuple[str, str] | None = None
    ) -> None:
        """Use the pickled custom ``updater`` (None: ASSIGN); ``owner``: the store's owner's."""
        self.settings.set_updater(updater, owner, call_id)
        await self.log.control("set_updater", updater, owner, call_id)

    @answered
    async def set_optimizer(
        self,
        config: dict[str, Any],
        owner: bool = True,
        rank: int = 0,
        call_id: tuple[str, str] | None = None,
    ) -> None:
        """Use the optimizer of ``config`` (``to_config()``), set by rank ``rank``."""
        self.settings.set_optimizer(config, owner, rank, call_id)
        await self.log.control("set_optimizer", config, owner, rank, call_id)

    @answered
    async def get_states(self) -> States:
        """``(num_update, per-key update counts, per-key state pieces)``."""
        return self.settings.get_states()

    @answered
    async def set_states(
        self, num_update: int, counts: dict[Key, int], states: dict[Key, tuple]
    ) -> None:
        self.settings.set_states(num_update, counts, states)
        await self.log.control("set_states", num_update, counts, states)

    @answered
    async def link(self, peers: list[tuple[str, str]]) -> None:
        """Every server of the store as ``(worker address, actor key)``, by server id."""
        self.peers.link(peers)

    # -- run control and reads that never wait -------------------------------------------
    @answered
    async def configure(self, num_workers: int) -> None:
        """Set the number of ranks a dist_sync round waits for (no round may be open)."""
        try:
            self.rounds.resize(num_workers)
        except ValueError as exc:
            raise ClusterError(f"server {self.sid}: {exc}") from None
        self.mode.configure(num_workers)
        self.marks.clear()
        self.waiting.resume()

    @answered
    async def barrier(
        self, group: str, rank: int, generation: Any, parties: int, told: tuple[str, ...] = ()
    ) -> None:
        """Return once ``parties`` ranks of ``group`` entered ``generation`` (``told``: backups told)."""
        self.fences.check(f"{group}/", rank)
        if await self.barriers.enter(group, rank, generation, parties, told):
            self.log.barrier_passed(group, generation, self.barriers)

    @answered
    async def barrier_arrived(self, group: str, rank: int, generation: Any, parties: int) -> None:
        """A backup keeps an arrival the primary answers (a failover loses none)."""
        self.fences.check(f"{group}/", rank)
        self.barriers.arrive(group, rank, generation, parties)

    @answered
    async def fence(self, prefix: str, rank: int, seconds: float, run: str | None = None) -> Any:
        """Rank ``rank`` is lost: refuse ``prefix`` and hold waits ``seconds`` for its replacement,
        or (``run``, its barrier group) go on without it (barriers, clocks and sliced updates:
        ``on_rank_loss="shrink"``); its resume step."""
        if run is None:
            self.fences.bar(prefix, "that was replaced after it was taken for lost")
            self.waiting.hold(seconds)
        else:
            go_on_without(self, prefix, rank, run)
        return self.marks.resume(rank)

    @answered
    async def resume_step(self, rank: int) -> int | None:
        return self.marks.resume(rank)  # the first step rank has not pushed every key of

    @answered
    async def abort(self, reason: str, run: str | None = None) -> None:
        """Wake every waiter with ``ClusterError(reason)`` and drop open rounds; ``run``: the
        barrier group of the stopped run, whose ranks (some may still run) are refused from now on."""
        if run is not None:
            self.fences.bar(f"{run}/")
        self.rounds.drop_open()
        self.updates.abort()
        self.waiting.abort(reason)

    @answered
    async def peek(self, keys: list[Key]) -> list[Any]:
        """Copies of the stored pieces as they are now (no waits, no events)."""
        return [host_copy(self.shard.read(k)) for k in keys]

    @answered
    async def summary(self, key: Key) -> dict[str, float]:
        """min/max/mean/norm of a stored piece (for checks without moving it)."""
        return summarize(self.shard.read(key))

    @answered
    async def streaming(self, on: bool, detail_interval: float = 0.0, detail_burst: int = 1):
        """Send batched events to the store's topic, with the subscribers' detail (on), or stop."""
        if on:
            self.stream.start(detail_interval, detail_burst)
        else:
            self.stream.stop()

    @answered
    async def load(self) -> dict[str, Any]:
        """Bytes in/out so far, keys and bytes held, the replicas, the replays."""
        return self._load()

    def _load(self) -> dict[str, Any]:
        return {**self.reports.load(), **self.log.load(), **self.marks.load()}
