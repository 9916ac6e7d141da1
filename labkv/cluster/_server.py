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

dist_sync rounds: per key, the server collects one push per rank; the W-th
completes the round, the sum goes through ``Shard.apply`` once, and the
round counter advances. A rank's pull waits for the round its last push
joined; a sender that never pushed the key (the notebook watching) gets the
last completed value at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..devices import copy_into, empty, new_like, to_device
from ..events import EventBus, summarize
from ..optimizers import Optimizer
from ..shard import Shard
from ._device import device_label, host_copy, host_view, pick_server_device
from ._events import EventStream
from ._pack import PACK_BELOW, pack, seal, unpack_values, unseal

Key = int | str

# Values smaller than this are copied before they are returned by a pull: the
# reply is serialised after the method returns, and an unrelated push could
# change the stored array in between. Big values of a rank's own sync round are
# sent without a copy (no push can change them before that rank pushes again).
_COPY_BELOW = 1 << 20


def _expire(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)  # the waiter re-checks, then names what is missing


class ClusterError(RuntimeError):
    """A cross-process wait failed: a timeout (naming what is missing), an
    aborted run, or an updater that raised on a server."""


#: What a timed-out wait raises: one class from Python 3.11 on, three before.
TIMEOUTS = (TimeoutError, concurrent.futures.TimeoutError, asyncio.TimeoutError)


class _Round:
    """dist_sync bookkeeping of one key on one server."""

    __slots__ = ("done", "pending", "first_push", "errors")

    def __init__(self) -> None:
        self.done = 0  # completed rounds
        self.pending: dict[int, Any] = {}  # rank -> value pushed in round `done`
        self.first_push: float | None = None
        self.errors: dict[int, str] = {}  # round -> why its update failed


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
    ):
        from distributed import get_worker

        worker = get_worker()
        self.device = pick_server_device(device, sid, f"Dask worker {worker.address}")
        self.device_name = device_label(self.device)
        self.sid, self.store_id, self.num_workers = sid, store_id, num_workers
        self.sync, self.timeout, self.topic = sync, timeout, topic
        self.bus = EventBus(store_id)
        self.shard = Shard(self.bus, server=sid)
        self.meta: dict[Key, tuple[tuple[int, ...], str]] = {}
        self.first_piece: dict[Key, bool] = {}
        self.rounds: dict[Key, _Round] = {}
        self.next_seq: dict[str, int] = {}
        self._stage: dict[tuple[Key, int], Any] = {}
        self.joined: dict[tuple[str, Key], int] = {}
        self.bytes_in = self.bytes_out = 0
        self.messages = {"push": 0, "pull": 0}
        self._aborted: str | None = None
        self._waiters: dict[asyncio.Future, Callable[[], bool]] = {}
        self.address = worker.address
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
        missing = sorted(set(range(self.num_workers)) - set(r.pending))
        return f"ranks {missing} have not pushed key {key!r} in round {r.done}"

    # -- keys -------------------------------------------------------------------
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
            self.first_piece[key] = self.sid == 0 or piece.size == int(np.prod(shape))
            self.rounds[key] = _Round()
            self.bytes_in += piece.nbytes
        self._wake()

    async def keys(self, wanted: list[Key] | None = None) -> dict[Key, tuple[tuple, str]]:
        """``{key: (shape, dtype)}`` of the wanted keys that exist (all with None)."""
        if wanted is None:
            return dict(self.meta)
        return {k: self.meta[k] for k in wanted if k in self.meta}

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
    async def push(self, msg: tuple) -> None:
        """One push message (see :func:`labkv.cluster._store.DistStore._push_impl`):
        ``((sender, rank, seq, keys, dtypes, big, borrowed), packed, bigs)``,
        the ``seq``-th push of ``sender``. ``keys[i]`` for ``i`` in ``big`` has
        its own array in ``bigs`` (in order); the others' values lie in ``packed``
        (:mod:`._pack`) with this server's piece shapes and the stored dtypes
        (or ``dtypes``, when given). ``borrowed``: the big arrays are the
        caller's own (a rank on this worker, which may reuse them at once)."""
        (sender, rank, seq, keys, dtypes, big, borrowed), packed, bigs = unseal(msg)
        self.messages["push"] += 1
        await self._pushes_arrived(sender, seq, f"rank {rank}")
        try:
            values = self.shard.values
            for key in keys:
                if key not in values:
                    raise KeyError(f"key {key!r} is not initialised on server {self.sid}")
            items = self._items(keys, dtypes, big, packed, bigs)
            self.bytes_in += sum(v.nbytes for _, v in items)
            if self.sync:
                await self._push_sync(sender, rank, items, borrowed and bool(big))
            else:
                if self.bus.active:
                    for key, value in items:
                        self._emit_receipt(key, value, rank)
                self.shard.apply([(k, [v]) for k, v in items])
        finally:
            self.next_seq[sender] = seq + 1
            self._wake()

    def _items(
        self, keys: list[Key], dtypes: list | None, big: list[int], packed: Any, bigs: list
    ) -> list[tuple[Key, Any]]:
        """``(key, value)`` pairs of a push message (views into ``packed``)."""
        values = self.shard.values

        def specs(small_keys: list[Key]) -> list[tuple[Any, tuple[int, ...]]]:
            if dtypes is None:
                return [(values[k].dtype, values[k].shape) for k in small_keys]
            return [(d, values[k].shape) for k, d in zip(small_keys, dtypes, strict=True)]

        return unpack_values(keys, big, packed, bigs, specs)

    async def _push_sync(
        self, sender: str, rank: int, items: list[tuple[Key, Any]], borrowed: bool
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
            r.pending[rank] = value
            self.joined[(sender, key)] = r.done
            if self.bus.active:
                self._emit_receipt(key, value, rank)
                self._emit_round(key, r)
            if len(r.pending) >= self.num_workers:
                complete.append(key)
        if complete:
            self._complete(complete)

    def _staged(self, key: Key, rank: int, value: Any) -> Any:
        """A copy of a borrowed value, in this rank's staging buffer for ``key``:
        free again, since the rank's previous value of the key was applied when
        its round completed (a rank has at most one value pending per key)."""
        stage = self._stage.get((key, rank))
        if stage is None or stage.shape != value.shape or stage.dtype != value.dtype:
            stage = self._stage[(key, rank)] = empty(value.shape, value.dtype, self.device)
        copy_into(stage, value)
        return stage

    def _complete(self, keys: list[Key]) -> None:
        """Apply the rounds of ``keys`` (all ranks pushed) in one ``Shard.apply``."""
        batch = [
            (k, [self.rounds[k].pending[q] for q in sorted(self.rounds[k].pending)]) for k in keys
        ]
        error = None
        try:
            self.shard.apply(batch)
        except Exception as exc:  # the round still ends, so no rank waits forever
            error = f"the update of round {{}} failed: {type(exc).__name__}: {exc}"
        for key in keys:
            r = self.rounds[key]
            if error is not None:
                r.errors[r.done] = error.format(r.done)
                for old in [g for g in r.errors if g < r.done - 100]:
                    del r.errors[old]
            done_round = r.done
            r.done += 1
            if self.bus.active:
                self._emit_round(key, r, completed=done_round)
            r.pending = {}
            r.first_push = None
        if error is not None:
            raise ClusterError(f"server {self.sid}, keys {keys}: {error.format('(this)')}")

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
                if joined in r.errors:
                    raise ClusterError(f"server {self.sid}, key {key!r}: {r.errors[joined]}")
                own_round.add(key)
        small, big, bigs = [], [], []
        nbytes = 0
        for i, key in enumerate(keys):
            value = self.shard.read(key)
            nbytes += value.nbytes
            if value.nbytes < PACK_BELOW:
                small.append(host_view(value))  # packing copies it
                continue
            if key not in own_round or value.nbytes < _COPY_BELOW:
                value = host_copy(value)
            big.append(i)
            bigs.append(host_view(value))
        self.bytes_out += nbytes
        return seal((big, pack(small) if small else None, bigs))

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
                extra={"first_piece": self.first_piece[key]},
            )

    def _annotate(self, event: dict[str, Any]) -> None:
        """Counted pushes (``bus.flush()``) say whether they are slice 0's too, so
        that views count each push of a sliced key once."""
        if event["op"] == "push" and event["extra"].get("tally"):
            event["extra"]["first_piece"] = self.first_piece.get(event["key"], True)

    def _emit_round(self, key: Key, r: _Round, completed: int | None = None) -> None:
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

    async def streaming(
        self, on: bool, detail_interval: float = 0.0, detail_burst: int = 1
    ) -> None:
        """Send batched events to the store's topic (on) or stop (off); the
        detail settings are those of the notebook's subscribers."""
        if on:
            self.stream.start(detail_interval, detail_burst)
        else:
            self.stream.stop()

    async def load(self) -> dict[str, Any]:
        """Bytes in/out so far, keys held and bytes held."""
        return self._load()

    # -- updaters, optimizers, states -------------------------------------------
    async def set_updater(self, updater: Callable | None) -> None:
        self.shard.set_updater(updater)

    async def set_optimizer(self, config: dict[str, Any]) -> None:
        self.shard.set_optimizer(Optimizer.from_config(config))

    async def get_states(self) -> tuple[int, dict[Key, int], dict[Key, tuple]]:
        """``(num_update, per-key update counts, per-key state pieces)``."""
        opt = self.shard.optimizer
        if opt is None:
            raise ClusterError(f"server {self.sid} has no optimizer")
        states = {k: tuple(host_copy(a) for a in st) for k, st in self.shard.states.items()}
        return opt.num_update, dict(opt.index_update_count), states

    async def set_states(
        self, num_update: int, counts: dict[Key, int], states: dict[Key, tuple]
    ) -> None:
        opt = self.shard.optimizer
        if opt is None:
            raise ClusterError(f"server {self.sid} has no optimizer")
        placed = {}
        for key, state in states.items():
            stored = self.shard.read(key)
            placed[key] = tuple(new_like(stored, np.asarray(a)) for a in state)
        opt.num_update = num_update
        opt.index_update_count = dict(counts)
        self.shard.states = placed

    # -- run control --------------------------------------------------------------
    async def configure(self, num_workers: int) -> None:
        """Set the number of ranks a dist_sync round waits for (no round may be open)."""
        open_rounds = [k for k, r in self.rounds.items() if r.pending]
        if open_rounds and num_workers != self.num_workers:
            raise ClusterError(f"server {self.sid}: keys {open_rounds} have an open round")
        self.num_workers = num_workers
        self._aborted = None

    async def abort(self, reason: str) -> None:
        """Wake every waiter with ``ClusterError(reason)`` and drop open rounds."""
        self._aborted = reason
        for r in self.rounds.values():
            r.pending, r.first_push = {}, None
        self._wake()

    async def peek(self, keys: list[Key]) -> list[Any]:
        """Copies of the stored pieces as they are now: no waiting for rounds or
        for in-flight pushes, no events (what a monitor draws)."""
        return [host_copy(self.shard.read(k)) for k in keys]

    async def summary(self, key: Key) -> dict[str, float]:
        """min/max/mean/norm of a stored piece (for checks without moving it)."""
        return summarize(self.shard.read(key))
