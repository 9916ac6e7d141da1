"""A server shard: one Dask actor holding its keys in a :class:`~labkv.shard.Shard`.

Every method is ``async def``. A Dask worker runs the *sync* methods of all
its actors on one thread, so a server that blocked while waiting for the
other ranks' pushes would stall every other shard on that worker (and two
shards waiting for each other's rounds would deadlock). ``async`` methods run
on the worker's event loop instead: a wait is an ``await`` on the server's
future (see ``Server._wait``), and the loop serves other calls meanwhile. Update
arithmetic (``Shard.apply``) runs inline on the loop: it is short and never waits.

Ordering: a rank's pushes may travel on different connections, so each push
carries a per-(sender, server) sequence number and the server applies a
sender's pushes in that order. A pull carries the number of pushes the sender
has sent to this server and first waits for them, so a rank can send a push
without waiting for its reply and still read its own write.

dist_ssp clocks (:class:`~._rounds.Clocks`): pushes are applied as in
dist_async and advance the pushing rank's clock of their keys; a pull waits
until every rank's clock is within the staleness bound of the puller's.

dist_sync rounds: per key, the server collects one push per rank; the W-th
completes the round, the sum goes through ``Shard.apply`` once, and the
round counter advances. A rank's pull waits for the round its last push
joined; a sender that never pushed the key (the notebook watching) gets the
last completed value at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import pickle
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..compression import from_wire, wire_nbytes
from ..devices import copy_into, empty, to_device
from ..events import EventBus, summarize
from ..optimizers import Optimizer
from ..reduce import sum_into
from ..shard import Shard
from ._device import (
    device_label,
    host_copy,
    host_view,
    packed_on_host,
    pick_server_device,
    warm_up,
)
from ._events import EventStream
from ._pack import PACK_BELOW, seal, unpack_values, unseal
from ._rounds import (
    Clocks,
    Failure,
    Round,
    UpdateQueue,
    add_note,
    failure_note,
    portable,
    pushed_by,
)

Key = int | str

# Values smaller than this are copied before they are returned by a pull: the
# reply is serialised after the method returns, and an unrelated push could
# change the stored array in between. Big values of a rank's own sync round are
# sent without a copy (no push can change them before that rank pushes again).
_COPY_BELOW = 1 << 20


def _forget(task: asyncio.Future) -> None:
    """Done-callback of a call not waited for: its error (a lost peer) is seen
    as the update that times out naming that peer, so it is only retrieved here."""
    if not task.cancelled():
        task.exception()


def _expire(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)  # the waiter re-checks, then names what is missing


class ClusterError(RuntimeError):
    """A cross-process wait failed: a timeout (naming what is missing), an
    aborted run, or an updater that raised on a server."""


#: What a timed-out wait raises: one class from Python 3.11 on, three before.
TIMEOUTS = (TimeoutError, concurrent.futures.TimeoutError, asyncio.TimeoutError)


def _answered(method: Callable) -> Callable:
    """Mark every exception a server method raises as the server's answer (an
    updater's error, a timeout it names), so that a rank never takes it for a
    lost connection (see ``DistStore._wait_one``)."""

    @functools.wraps(method)
    async def answer(self: Server, *args: Any, **kwargs: Any) -> Any:
        try:
            return await method(self, *args, **kwargs)
        except Exception as exc:
            exc._labkv_server = self.sid
            raise

    return answer


async def execute_on(worker: Any, address: str, actor_key: str, method: str, args: list) -> Any:
    """What ``Actor.<method>(*args)`` sends, from ``worker``'s event loop to the
    actor ``actor_key`` on the worker at ``address``: its result, or its error."""
    from distributed.protocol import to_serialize

    try:
        reply = await worker.rpc(address).actor_execute(
            function=method, actor=actor_key, args=[to_serialize(a) for a in args], kwargs={}
        )
    except OSError as exc:
        raise OSError(f"Unable to contact Actor's worker: {exc}") from exc
    if reply["status"] == "OK":
        return reply["result"]
    raise reply["exception"]


class Server:
    """The server actor (see module doc); made by :func:`labkv.cluster._store.start_servers`."""

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
    ):
        from distributed import get_worker

        worker = get_worker()
        self.device = pick_server_device(device, sid, f"Dask worker {worker.address}")
        self.device_name = device_label(self.device)
        warm_up(self.device)  # first-use kernel compiles now, not inside the first push
        self.sid, self.store_id, self.num_workers = sid, store_id, num_workers
        self.sync, self.timeout, self.topic = sync, timeout, topic
        self.bus = EventBus(store_id)
        self.shard = Shard(self.bus, server=sid)
        self.meta: dict[Key, tuple[tuple[int, ...], str]] = {}
        self.first_piece: dict[Key, bool] = {}
        self.rounds: dict[Key, Round] = {}
        # Keys cut into slices (one per server) and the servers of this store
        # ``(worker address, actor key)``: a sliced key's update commits on every
        # server or none, so the servers vote on each one (see _vote).
        self.sliced: set[Key] = set()
        self.peers: list[tuple[str, str]] = []
        self._votes: dict[tuple[Key, int], dict[int, BaseException | None]] = {}
        self._prepared: dict[tuple[Key, int], tuple[Any, Failure | None, dict]] = {}
        self.queues: dict[Key, UpdateQueue] = {}  # dist_async: sliced keys' updates in order
        self._tasks: set[asyncio.Future] = set()
        self.next_seq: dict[str, int] = {}
        self._stage: dict[tuple[Key, int], Any] = {}
        self.joined: dict[tuple[str, Key], int] = {}
        self.bytes_in = self.bytes_out = 0
        self.messages = {"push": 0, "pull": 0}
        self._aborted: str | None = None
        self._waiters: dict[asyncio.Future, Callable[[], bool]] = {}
        self.address = worker.address
        self._worker = worker
        # dist_ssp: per-key clocks of the ranks, and each sender's rank (a pull names its sender)
        self.clocks = None if staleness is None else Clocks(staleness, num_workers)
        self.rank_of: dict[str, int] = {}
        self.stream = EventStream(
            self.bus,
            lambda batch: worker.log_event(self.topic, batch),
            self._load,
            annotate=self._annotate,
        )

    # -- waiting ---------------------------------------------------------------
    async def _wait(self, ready: Callable[[], bool], missing: Callable[[], str]) -> None:
        """Wait until ``ready()``; on timeout raise naming ``missing()``.

        A waiter is a bare future checked by :meth:`_wake` after every state
        change: the waiting coroutine resumes in the loop's next iteration (an
        ``asyncio.Condition`` with ``wait_for`` took a task and several
        iterations to hand the lock around, on the path of every pull)."""
        if ready():
            return
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self.timeout
        while not ready():
            if self._aborted is not None:
                raise ClusterError(f"server {self.sid}: {self._aborted}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClusterError(
                    f"server {self.sid} timed out after {self.timeout:g} s: {missing()}"
                )
            future = loop.create_future()
            self._waiters[future] = ready
            timer = loop.call_later(left, _expire, future)
            try:
                await future
            finally:
                timer.cancel()
                self._waiters.pop(future, None)

    def _wake(self) -> None:
        """Wake the waiters whose condition now holds (all of them after an abort)."""
        if not self._waiters:
            return
        for future, ready in list(self._waiters.items()):
            if future.done() or self._aborted is not None or ready():
                del self._waiters[future]
                if not future.done():
                    future.set_result(None)

    async def _pushes_arrived(self, sender: str, seq: int, who: str) -> None:
        """Wait until ``sender``'s first ``seq`` pushes have been applied here
        (they may travel on other connections than the call that waits)."""
        if self.next_seq.get(sender, 0) < seq:
            await self._wait(
                lambda: self.next_seq.get(sender, 0) >= seq,
                lambda: f"push #{self.next_seq.get(sender, 0)} from {who} never arrived",
            )

    def _missing_ranks(self, key: Key) -> str:
        r = self.rounds[key]
        missing = r.missing(self.num_workers)
        if not missing and (key, r.done) in self._prepared:
            return self._missing_votes(key)
        return f"ranks {missing} have not pushed key {key!r} in round {r.done}"

    def _missing_votes(self, key: Key) -> str:
        number = self.rounds[key].done
        voted = self._votes.get((key, number), {})
        if (key, number) in self._prepared:
            voted = {**voted, self.sid: None}
        late = [p for p in range(len(self.peers)) if p not in voted]
        return f"servers {late} have not reported their slice of update {number} of key {key!r}"

    # -- keys -------------------------------------------------------------------
    @_answered
    async def init(self, items: list[tuple[Key, Any, tuple, str]]) -> None:
        """Store new keys: ``(key, piece, full_shape, dtype)`` each."""
        for key, *_ in items:
            if key in self.meta:
                raise ValueError(f"key {key!r} is already initialised")
        for key, piece, shape, dtype in items:
            self.shard.init(key, to_device(np.asarray(piece, dtype=dtype), self.device))
            self.meta[key] = (tuple(shape), dtype)
            # A whole value, or slice 0 of a sliced one (slice s lives on server s): the
            # piece whose receipt stands for the push, so views count each push once.
            whole = piece.size == int(np.prod(shape))
            self.first_piece[key] = self.sid == 0 or whole
            if not whole:
                self.sliced.add(key)
            self.rounds[key] = Round()
            self.bytes_in += piece.nbytes
        self._wake()

    @_answered
    async def keys(self, wanted: list[Key] | None = None) -> dict[Key, tuple[tuple, str]]:
        """``{key: (shape, dtype)}`` of the wanted keys that exist (all with None)."""
        if wanted is None:
            return dict(self.meta)
        return {k: self.meta[k] for k in wanted if k in self.meta}

    @_answered
    async def wait_keys(self, wanted: list[Key]) -> dict[Key, tuple[tuple, str]]:
        """Wait until every wanted key is initialised (by rank 0); their metadata."""
        await self._wait(
            lambda: all(k in self.meta for k in wanted),
            lambda: (
                f"keys {[k for k in wanted if k not in self.meta]} were never initialised "
                "(rank 0 has not called init for them)"
            ),
        )
        return {k: self.meta[k] for k in wanted}

    # -- push and pull ----------------------------------------------------------
    @_answered
    async def push(self, msg: tuple) -> None:
        """One push message (see :func:`labkv.cluster._store.DistStore._push_impl`):
        ``((sender, rank, seq, keys, dtypes, big, borrowed), packed, bigs)``,
        the ``seq``-th push of ``sender``. ``keys[i]`` for ``i`` in ``big`` has
        its own array in ``bigs`` (in order); the others' values lie in ``packed``
        (:mod:`._pack`) with this server's piece shapes and the stored dtypes
        (or ``dtypes``, when given). ``borrowed``: the big arrays are the
        caller's own (a rank on this worker, which may reuse them at once)."""
        (sender, rank, seq, keys, dtypes, big, borrowed, codes), packed, bigs = unseal(msg)
        self.messages["push"] += 1
        await self._pushes_arrived(sender, seq, f"rank {rank}")
        try:
            values = self.shard.values
            for key in keys:
                if key not in values:
                    raise KeyError(f"key {key!r} is not initialised on server {self.sid}")
            items = self._items(keys, dtypes, big, packed, bigs, codes)
            self.bytes_in += sum(v.nbytes for _, v in items)  # as they travelled
            if codes is not None:
                items = self._decompressed(items, codes)
            if self.sync:
                await self._push_sync(sender, rank, seq, items, borrowed and bool(big))
            else:
                if self.bus.active:
                    for key, value in items:
                        self._emit_receipt(key, value, rank)
                queued = []
                if self.shard.updater is not None:  # sliced keys: see _queue_update
                    queued = [(k, v) for k, v in items if k in self.sliced]
                    items = [(k, v) for k, v in items if k not in self.sliced]
                    for key, value in queued:
                        self._queue_update(sender, seq, key, value)
                try:
                    self.shard.apply([(k, [v]) for k, v in items])
                except Exception as exc:
                    keys = [k for k, _ in items]
                    failure = self._failure(exc, keys, {sender: dict.fromkeys(keys, seq)})
                    raise failure.report_to(sender) from None
                finally:
                    await self._updates_decided(sender, [k for k, _ in queued])
        finally:
            if self.clocks is not None:
                self._ticked(sender, rank, keys)
            self.next_seq[sender] = seq + 1
            self._wake()

    def _items(
        self,
        keys: list[Key],
        dtypes: list | None,
        big: list[int],
        packed: Any,
        bigs: list,
        codes: tuple | None = None,
    ) -> list[tuple[Key, Any]]:
        """``(key, value)`` pairs of a push message (views into ``packed``); with
        ``codes``, the values are the packed compressed values of each device."""
        values = self.shard.values

        def specs(small_keys: list[Key]) -> list[tuple[Any, tuple[int, ...]]]:
            if codes is not None:
                kind, _, devices = codes
                return [
                    (np.uint8, (devices[k], wire_nbytes(kind, values[k].size))) for k in small_keys
                ]
            if dtypes is None:
                return [(values[k].dtype, values[k].shape) for k in small_keys]
            return [(d, values[k].shape) for k, d in zip(small_keys, dtypes, strict=True)]

        return unpack_values(keys, big, packed, bigs, specs)

    def _decompressed(self, items: list[tuple[Key, Any]], codes: tuple) -> list[tuple[Key, Any]]:
        """A compressed push's values: each device's codes unpacked and summed, in
        the rank's order and precision (so the result is bit-exact with a push of
        the same values uncompressed)."""
        kind, threshold, _ = codes
        result = []
        for key, packed in items:
            stored = self.shard.values[key]
            per_device = from_wire(kind, threshold, packed, stored.size)
            value = np.empty(stored.shape, np.float32)
            sum_into(value, [v.reshape(stored.shape) for v in per_device])
            result.append((key, value))
        return result

    async def _push_sync(
        self, sender: str, rank: int, seq: int, items: list[tuple[Key, Any]], borrowed: bool
    ) -> None:
        complete = []
        for key, value in items:
            r = self.rounds[key]
            if rank in r.pending:  # this rank is a round ahead: wait for the others
                await self._wait(
                    lambda r=r: rank not in r.pending, lambda k=key: self._missing_ranks(k)
                )
            # A borrowed value that completes its round is summed before this push
            # returns: only one that waits for other ranks needs a copy of its own.
            completes = len(r.pending) + 1 >= self.num_workers
            if borrowed and value.nbytes >= PACK_BELOW and not completes:
                value = self._staged(key, rank, value)
            if not r.pending:
                r.first_push = time.monotonic()
            r.join(rank, sender, seq, value)
            self.joined[(sender, key)] = r.done
            if self.bus.active:
                self._emit_receipt(key, value, rank)
                self._emit_round(key, r)
            if len(r.pending) >= self.num_workers:
                complete.append(key)
        if complete:
            self._complete(complete, sender)

    def _staged(self, key: Key, rank: int, value: Any) -> Any:
        """A copy of a borrowed value, in this rank's staging buffer for ``key``:
        free again, since the rank's previous value of the key was applied when
        its round completed (a rank has at most one value pending per key)."""
        stage = self._stage.get((key, rank))
        if stage is None or stage.shape != value.shape or stage.dtype != value.dtype:
            stage = self._stage[(key, rank)] = empty(value.shape, value.dtype, self.device)
        copy_into(stage, value)
        return stage

    def _failure(
        self, exc: BaseException, keys: list[Key], senders: dict, rounds: dict | None = None
    ) -> Failure:
        """The failure of an update of ``keys``: the updater's own exception,
        noted with where it was raised, owed to ``senders``."""
        add_note(exc, failure_note(self.sid, keys, rounds))
        return Failure(portable(exc), self.sid, keys, senders)

    def _complete(self, keys: list[Key], sender: str) -> None:
        """Apply the rounds of ``keys`` (all ranks pushed) in one ``Shard.apply``.

        The update of a sliced key with a custom updater is only prepared here:
        it commits when every server of the key has prepared its slice (see
        :meth:`_vote`). If the update fails, the completing push (``sender``'s)
        gets the error now and the other ranks at their next pull of the keys."""
        rounds = {k: self.rounds[k] for k in keys}
        batch = [(k, [rounds[k].pending[q] for q in sorted(rounds[k].pending)]) for k in keys]
        deferred = [k for k in keys if k in self.sliced and self.shard.updater is not None]
        prepared, failure = None, None
        try:
            if deferred:
                prepared = self.shard.prepare(batch)
            else:
                self.shard.apply(batch)
        except Exception as exc:  # the round still ends, so no rank waits forever
            numbers = {k: r.done for k, r in rounds.items()}
            failure = self._failure(exc, keys, pushed_by(keys, rounds), numbers)
        now = [k for k in keys if k not in deferred]
        if prepared is not None and now:
            self.shard.commit({k: prepared[k] for k in now})
        for key in now:
            self._finish(key, failure)
        for key in deferred:
            m = rounds[key].done
            candidate = None if prepared is None else prepared[key]
            self._prepared[(key, m)] = (candidate, failure, pushed_by([key], rounds))
            self._vote(key, m, None if failure is None else failure.error)
        if failure is not None and now:
            raise failure.report_to(sender)

    def _finish(self, key: Key, failure: Failure | None) -> None:
        r = self.rounds[key]
        if self.bus.active and self.sync:
            self._emit_round(key, r, completed=r.done)
        r.finish(failure)
        self._wake()

    # -- dist_async updates of sliced keys ---------------------------------------------
    def _queue_update(self, sender: str, seq: int, key: Key, value: Any) -> None:
        """Queue ``sender``'s push of a sliced key (a copy: the message's buffer is
        not ours to keep) and apply what is next in server 0's order.

        With a custom updater, a sliced key's update commits on all its slices or
        none, so every server applies the key's updates in one order: the order in
        which server 0 received the pushes (it queues every key of a message at
        once, so its orders of all keys agree), told with its votes. A push
        returns once its updates are decided; no wait can form a cycle, since
        every server decides in server 0's single order of messages."""
        self.queues.setdefault(key, UpdateQueue()).arrive(sender, value.copy(), seq, self.sid == 0)
        self._advance(key)

    def _advance(self, key: Key) -> None:
        """Prepare the next update of ``key`` in order, if it is here, and vote on it."""
        number = self.rounds[key].done
        taken = self.queues[key].take(number)
        if taken is None:
            return
        (sender, n), value, seq = taken
        senders = {sender: {key: seq}}
        candidate, failure = None, None
        try:
            candidate = self.shard.prepare([(key, [value])])[key]
        except Exception as exc:
            failure = self._failure(exc, [key], senders)
        self._prepared[(key, number)] = (candidate, failure, senders)
        self._vote(key, number, None if failure is None else failure.error, (sender, n))

    async def _updates_decided(self, sender: str, keys: list[Key]) -> None:
        """Wait until ``sender``'s queued updates of ``keys`` are decided; raise
        the first that failed (reported to ``sender`` once)."""
        for key in keys:
            q = self.queues[key]
            await self._wait(
                lambda q=q: not q.undecided.get(sender, 0), lambda k=key: self._missing_votes(k)
            )
        for key in keys:
            failed = self.rounds[key].report_to(sender)
            if failed is not None:
                raise failed

    # -- dist_ssp clocks ----------------------------------------------------------------
    def _ticked(self, sender: str, rank: int, keys: list[Key]) -> None:
        """``rank``'s push of ``keys`` is applied (or failed: it still counts, so
        that no other rank waits for it forever): advance its clocks."""
        self.rank_of[sender] = rank
        self.clocks.tick(rank, [k for k in keys if k in self.meta])

    async def _within_staleness(self, sender: str, keys: list[Key]) -> None:
        """Wait until every rank is within the staleness bound of ``sender``'s
        clock of each key (a sender that never pushed here does not wait);
        with events on, report each key's clocks and how long the pull waited."""
        rank = self.rank_of.get(sender)
        if rank is None:
            return
        clocks, watched = self.clocks, self.bus.active
        for key in keys:
            start = time.monotonic() if watched else 0.0
            if not clocks.ready(key, rank):
                await self._wait(
                    lambda k=key: clocks.ready(k, rank), lambda k=key: clocks.behind(k, rank)
                )
            if watched and self.first_piece.get(key, True):
                self._emit_clocks(key, rank, time.monotonic() - start)

    def _emit_clocks(self, key: Key, rank: int, waited: float) -> None:
        clocks = self.clocks.of(key)
        slowest, low = self.clocks.slowest(key)
        self.bus.emit(
            "clock",
            key,
            rank=rank,
            server=self.sid,
            extra={
                "clocks": [clocks[r] for r in sorted(clocks)],  # by rank (msgpack: no int keys)
                "clock": clocks.get(rank, 0),
                "staleness": self.clocks.staleness,
                "slowest": slowest,
                "slowest_clock": low,
                "waited_s": waited,
            },
        )

    # -- votes on sliced keys ------------------------------------------------------
    def _vote(
        self, key: Key, number: int, error: BaseException | None, push: tuple | None = None
    ) -> None:
        """Tell every server of the store whether this server's slice of update
        ``number`` of ``key`` (a dist_sync round, or the ``number``-th dist_async
        update, ``push``) succeeded (``error`` None), then decide."""
        for peer in range(len(self.peers)):
            if peer != self.sid:
                self._send(peer, "vote", key, number, self.sid, error, push)
        self._record_vote(key, number, self.sid, error)

    def _send(self, peer: int, method: str, *args: Any) -> None:
        """Call ``method`` of server ``peer`` without waiting (a vote never blocks
        the loop; a lost peer shows as an update that times out naming it)."""
        address, actor_key = self.peers[peer]
        local = self._worker.state.actors.get(actor_key) if address == self.address else None
        if isinstance(local, Server):
            call = getattr(local, method)(*args)
        else:
            call = execute_on(self._worker, address, actor_key, method, list(args))
        task = asyncio.ensure_future(call)
        self._tasks.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_forget)

    @_answered
    async def vote(
        self, key: Key, number: int, sid: int, error: BaseException | None, push: tuple | None
    ) -> None:
        """Server ``sid``'s outcome of its slice of update ``number`` of ``key``;
        from server 0 in dist_async, also which push that update is."""
        if push is not None and sid == 0:
            self.queues.setdefault(key, UpdateQueue()).learn(number, push)
        self._record_vote(key, number, sid, error)
        if not self.sync and key in self.queues:
            self._advance(key)

    def _record_vote(self, key: Key, number: int, sid: int, error: BaseException | None) -> None:
        """Count a vote; with every server's vote and this server's own update
        prepared, commit it if no slice failed, else keep nothing."""
        votes = self._votes.setdefault((key, number), {})
        votes[sid] = error
        if len(votes) < len(self.peers) or (key, number) not in self._prepared:
            return
        del self._votes[(key, number)]
        candidate, failure, senders = self._prepared.pop((key, number))
        if self.rounds[key].done != number:  # aborted meanwhile
            return
        failed = [sid for sid in sorted(votes) if votes[sid] is not None]
        if not failed:
            self.shard.commit({key: candidate})
        elif failure is None:  # another server's slice failed: report its error here too
            failure = Failure(votes[failed[0]], failed[0], [key], senders)
        if not self.sync:
            (sender,) = senders
            self.queues[key].decided(sender)
        self._finish(key, failure)  # wakes the waiters, so after the queue's count
        if not self.sync:
            self._advance(key)

    @_answered
    async def pull(self, msg: tuple) -> tuple[list[int], Any, list[Any]]:
        """The values of ``keys`` after this sender's first ``seq`` pushes (and,
        in dist_sync, after the rounds those pushes joined) have been applied;
        ``msg = (sender, seq, keys, pushes)``. ``pushes``: push messages the
        sender held back (see ``DistStore._hold``) and folded into this pull;
        they are applied first, in order, each as :meth:`push` would (all of
        them, even after one failed; the first error is then this call's).
        Returns ``(big, packed, bigs)``: the values of positions ``big`` in
        ``bigs``, the others packed (:mod:`._pack`); sealed into one ``bytes``
        when ``bigs`` is empty."""
        sender, seq, keys, pushes = unseal(msg)
        error = None
        for push in pushes:
            try:
                await self.push(push)
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error
        self.messages["pull"] += 1
        await self._pushes_arrived(sender, seq, "this worker")
        if self.clocks is not None:
            await self._within_staleness(sender, keys)
        own_round = set()
        if self.sync:
            for key in keys:
                joined = self.joined.get((sender, key))
                if joined is None:
                    continue
                r = self.rounds[key]
                if r.done <= joined:
                    await self._wait(
                        lambda r=r, j=joined: r.done > j, lambda k=key: self._missing_ranks(k)
                    )
                own_round.add(key)
        for key in keys:  # an update that failed reaches each rank once
            failed = self.rounds[key].report_to(sender)
            if failed is not None:
                raise failed
        small, big, bigs = [], [], []
        nbytes = 0
        for i, key in enumerate(keys):
            value = self.shard.read(key)
            nbytes += value.nbytes
            if value.nbytes < PACK_BELOW:
                small.append(value)  # packed below: one copy to the host for all
                continue
            if key not in own_round or value.nbytes < _COPY_BELOW:
                value = host_copy(value)
            big.append(i)
            bigs.append(host_view(value))
        self.bytes_out += nbytes
        return seal((big, packed_on_host(small) if small else None, bigs))

    # -- events -----------------------------------------------------------------
    def _emit_receipt(self, key: Key, value: Any, rank: int) -> None:
        admitted = self.bus.admit("push", key, int(value.nbytes), rank, self.sid)
        if admitted:  # else only counted: bus.flush() reports it at the next tick
            self.bus.emit(
                "push",
                key,
                value,
                rank=rank,
                server=self.sid,
                count=admitted[0],
                nbytes=admitted[1],
                first_piece=self.first_piece[key],
            )

    def _annotate(self, event: dict[str, Any]) -> None:
        """Counted pushes (``bus.flush()``) say whether they are slice 0's too, so
        that views count each push of a sliced key once."""
        if event["op"] == "push" and event["tally"]:
            event["first_piece"] = self.first_piece.get(event["key"], True)

    def _emit_round(self, key: Key, r: Round, completed: int | None = None) -> None:
        pushed = sorted(r.pending)
        waited = 0.0 if r.first_push is None else time.monotonic() - r.first_push
        self.bus.emit(
            "round",
            key,
            server=self.sid,
            extra={
                "round": r.done if completed is None else completed,
                "pushed": pushed,
                "missing": sorted(set(range(self.num_workers)) - set(pushed)),
                "num_workers": self.num_workers,
                "waited_s": waited,
                "complete": completed is not None,
            },
        )

    def _load(self) -> dict[str, Any]:
        held = sum(int(v.nbytes) for v in self.shard.values.values())
        held += sum(int(a.nbytes) for s in self.shard.states.values() for a in s)
        return {
            "server": self.sid,
            "device": self.device_name,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "keys": len(self.shard.values),
            "bytes_held": held,
            "messages": dict(self.messages),
        }

    @_answered
    async def streaming(
        self, on: bool, detail_interval: float = 0.0, detail_burst: int = 1
    ) -> None:
        """Send batched events to the store's topic (on) or stop (off); the
        detail settings are those of the notebook's subscribers."""
        if on:
            self.stream.start(detail_interval, detail_burst)
        else:
            self.stream.stop()

    @_answered
    async def load(self) -> dict[str, Any]:
        """Bytes in/out so far, keys held and bytes held."""
        return self._load()

    # -- updaters, optimizers, states -------------------------------------------
    @_answered
    async def set_updater(self, updater: bytes | None) -> None:
        """Use the pickled custom ``updater`` (None: back to ASSIGN)."""
        self.shard.set_updater(None if updater is None else pickle.loads(updater))

    @_answered
    async def link(self, peers: list[tuple[str, str]]) -> None:
        """Every server of the store as ``(worker address, actor key)``, by server id."""
        self.peers = [tuple(p) for p in peers]

    @_answered
    async def set_optimizer(self, config: dict[str, Any]) -> None:
        self.shard.set_optimizer(Optimizer.from_config(config))

    @_answered
    async def get_states(self) -> tuple[int, dict[Key, int], dict[Key, tuple]]:
        """``(num_update, per-key update counts, per-key state pieces)``."""
        if self.shard.optimizer is None:
            raise ClusterError(f"server {self.sid} has no optimizer")
        num_update, counts, states = self.shard.export_states()
        return num_update, counts, {k: tuple(host_copy(a) for a in st) for k, st in states.items()}

    @_answered
    async def set_states(
        self, num_update: int, counts: dict[Key, int], states: dict[Key, tuple]
    ) -> None:
        if self.shard.optimizer is None:
            raise ClusterError(f"server {self.sid} has no optimizer")
        self.shard.import_states(num_update, counts, states)

    # -- run control --------------------------------------------------------------
    @_answered
    async def configure(self, num_workers: int) -> None:
        """Set the number of ranks a dist_sync round waits for (no round may be open)."""
        open_rounds = [k for k, r in self.rounds.items() if r.pending]
        if open_rounds and num_workers != self.num_workers:
            raise ClusterError(f"server {self.sid}: keys {open_rounds} have an open round")
        self.num_workers = num_workers
        if self.clocks is not None:
            self.clocks.reset(num_workers)
        self._aborted = None

    @_answered
    async def abort(self, reason: str) -> None:
        """Wake every waiter with ``ClusterError(reason)`` and drop open rounds."""
        self._aborted = reason
        for r in self.rounds.values():
            r.pending, r.senders, r.first_push = {}, {}, None
        self._prepared.clear()
        self._votes.clear()
        self.queues.clear()
        self._wake()

    @_answered
    async def peek(self, keys: list[Key]) -> list[Any]:
        """Copies of the stored pieces as they are now: no waiting for rounds or
        for in-flight pushes, no events (what a monitor draws)."""
        return [host_copy(self.shard.read(k)) for k in keys]

    @_answered
    async def summary(self, key: Key) -> dict[str, float]:
        """min/max/mean/norm of a stored piece (for checks without moving it)."""
        return summarize(self.shard.read(key))
