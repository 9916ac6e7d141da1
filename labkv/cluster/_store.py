"""The worker-side distributed store: a :class:`~labkv.store.KVStore` whose
keys live on server actors (:mod:`._server`) on Dask workers.

The base class normalises and validates every call; this backend turns the
checked ``[(key, [arrays])]`` into one message per server per call, and
assembles what the servers send back.

Choices made here, and why:

- **Pushes below ``_ACK_ABOVE`` bytes are not waited for.** The arrays are
  copied (cheap at that size, and the caller may reuse its buffer at once)
  and the push is in flight when ``push`` returns; the next pull carries the
  number of pushes sent, and the server waits for them, so a rank still reads
  its own writes. A push's error (a lost server, an updater that raised)
  surfaces at the next call. Big pushes are sent without a copy and waited
  for: a copy would cost more than the reply's latency.
- **A rank holds a small push back and folds it into its next pull** of the
  same server (see ``DistStore._hold``): one message each way per push+pull
  instead of two, on both event loops. A timer on the worker's loop sends a
  held push on its own after ``_HOLD_S`` (another rank's dist_sync round never
  waits longer than that for it), and every other call sends what is held first.
- **Per-device values are summed here first** (``dist_device_sync``: on the
  device they live on), so one array per key crosses the network.
- **Only the store's owner (rank 0, or the notebook when it shares its store
  with a run) initialises keys and ships updaters/optimizers.** Other ranks
  wait until the keys exist; a rank-0 push cannot enter a round before the
  optimizer it set is on every server, so no ordering race exists in dist_sync.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import math
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import distributed
import numpy as np

from .._types import SYNC_KINDS, dist_kind
from ..compression import GradientCompression, to_wire
from ..devices import copy_into, device_of, empty
from ..events import EventBus
from ..optimizers import Optimizer
from ..reduce import sum_into
from ..store import Items, Key, KVStore
from ._barrier import EventBarrier
from ._connect import ClusterHandle, default_handle
from ._device import host_view, parse_server_device
from ._events import ClusterBus, topic_of
from ._pack import PACK_BELOW, sealable
from ._placement import DEFAULT_BIGARRAY_BOUND, Piece, place
from ._rounds import check_staleness
from ._server import TIMEOUTS, ClusterError, Server, execute_on
from ._wire import (
    Codes,
    InitItem,
    Pull,
    Push,
    PushHeader,
    decode_values,
    encode,
    pack_values,
    values_items,
)

DEFAULT_TIMEOUT_S = 120.0
_ACK_ABOVE = 1 << 20
# Client-side waits get this much longer than the servers' own, so that the
# server's error (which names the missing ranks) arrives before ours.
_GRACE_S = 5.0
# How often a wait for a server looks whether the scheduler reported it lost.
_POLL_S = 0.5
# Server methods a rank calls in-process when the server lives on its own Dask
# worker (see DistStore._call): those whose arguments the server copies or only
# reads, and whose results are fresh objects or values the rank may read.
_LOCAL_METHODS = frozenset({"push", "pull", "keys", "wait_keys", "init"})
# Methods whose one argument is a message tuple that may travel as one pickled frame.
_SEALED = frozenset({"push", "pull"})
# A held push (see DistStore._hold) goes out on its own after at most this long.
_HOLD_S = 0.001


def _settle(src: Any, dst: concurrent.futures.Future) -> None:
    """Give ``dst`` the outcome of the finished call ``src`` (a done-callback)."""
    if dst.done():
        return
    try:
        exc = src.exception()
    except BaseException as cancelled:  # CancelledError
        exc = cancelled
    if exc is None:
        dst.set_result(None)
    else:
        dst.set_exception(exc)


def _dispatch(held: list, send: Callable[[int, Any], Any]) -> None:
    """Send held pushes ``(server, message, future, since)`` with ``send``, in
    order; each future settles as its call does (a call that cannot even be
    made, to a lost server, fails it as if sent)."""
    for s, msg, done, _ in held:
        try:
            call = send(s, msg)
        except Exception as exc:
            done.set_exception(exc)
            continue
        call.add_done_callback(lambda call, done=done: _settle(call, done))


@dataclass
class StoreSpec:
    """What a rank needs to reach a store's servers (picklable; the actor
    handles travel separately, as task arguments Dask tracks)."""

    kind: str
    store_id: str
    num_servers: int
    server_addresses: list[str]
    bigarray_bound: int = DEFAULT_BIGARRAY_BOUND
    timeout: float = DEFAULT_TIMEOUT_S
    group: str = field(default_factory=lambda: f"labkv-barrier-{uuid.uuid4().hex[:8]}")
    #: each server's device, as its placement shows it (``'cpu(0)'``, ``'gpu(0)'``)
    server_devices: list[str] = field(default_factory=list)
    #: the type name the store was made with (``kv.type``; e.g. MXNet's ``'dist'``)
    name: str = ""
    #: dist_ssp: how many rounds a rank may run ahead of the slowest (None otherwise)
    staleness: int | None = None

    @property
    def sync(self) -> bool:
        return self.kind in SYNC_KINDS


def start_servers(
    handle: ClusterHandle,
    kind: str,
    num_servers: int,
    num_workers: int,
    timeout: float,
    workers: list[str] | None = None,
    device: str = "auto",
    bigarray_bound: int = DEFAULT_BIGARRAY_BOUND,
    store_id: str | None = None,
    name: str | None = None,
    staleness: int | None = None,
) -> tuple[list[Any], list[Any], StoreSpec]:
    """Start ``num_servers`` server actors of a new store (``store_id``, made
    from ``kind`` by default) round-robin on ``workers`` (default: all, sorted),
    keeping their values on ``device`` (see :mod:`labkv.cluster._device`);
    ``(futures, actors, spec)``; ``name`` is the type name the user gave,
    ``staleness`` a dist_ssp store's bound.

    Actors are pinned (``allow_other_workers=False``): a server's keys live in
    its worker's memory, so Dask must never move or re-run it elsewhere. A
    server that cannot start (no GPU for ``device='gpu'``), or does not start
    within ``timeout`` (its worker gone), fails the call, and the servers
    already started are released.
    """
    client = handle.client
    store_id = store_id or f"{kind}-{uuid.uuid4().hex[:8]}"
    workers = workers or handle.workers()
    if not workers:
        raise ClusterError("the Dask cluster has no workers to host servers")
    addresses = [workers[s % len(workers)] for s in range(num_servers)]
    futures = [
        client.submit(
            Server,
            s,
            store_id,
            num_workers,
            kind in SYNC_KINDS,
            timeout,
            topic_of(store_id),
            device,
            staleness,
            actor=True,
            workers=[addresses[s]],
            allow_other_workers=False,
            pure=False,
            key=f"labkv-server-{store_id}-{s}",
        )
        for s in range(num_servers)
    ]
    # The Actor handles bind to "the current client" when they are made; the
    # handle's client need not be Dask's default one (set_as_default=False).
    with client.as_current():
        try:
            distributed.wait(futures, timeout=timeout)
        except TIMEOUTS:
            late = [s for s, f in enumerate(futures) if f.status == "pending"]
            client.cancel(futures)
            raise ClusterError(
                f"servers {late} of {store_id} did not start within {timeout:g} s on Dask "
                f"worker(s) {sorted({addresses[s] for s in late})} (gone, or too busy?)"
            ) from None
        try:
            actors = client.gather(futures)
            devices = [actor.device_name for actor in actors]
            peers = [(addresses[s], futures[s].key) for s in range(num_servers)]
            for call in [actor.link(peers) for actor in actors]:
                call.result(timeout=timeout)
        except Exception as exc:
            client.cancel(futures)
            raise ClusterError(f"the servers of {store_id} could not start: {exc}") from exc
    spec = StoreSpec(
        kind,
        store_id,
        num_servers,
        addresses,
        int(bigarray_bound),
        float(timeout),
        server_devices=devices,
        name=name or kind,
        staleness=staleness,
    )
    return futures, actors, spec


def _same(array: Any) -> Any:
    return array


def _host(array: Any) -> np.ndarray:
    """A plain, C-contiguous numpy array (no copy when it already is one)."""
    return np.asarray(host_view(array), order="C")


def _split(array: Any, pieces: list[Piece]) -> list[tuple[int, Any]]:
    """``(server, part)`` of a value placed as ``pieces``: the array itself on
    one server, or one flat slice (a view) per server."""
    if len(pieces) == 1:
        return [(pieces[0].server, array)]
    flat = array.reshape(-1)
    return [(p.server, flat[p.start : p.stop]) for p in pieces]


def _join(parts: list[Any], shape: tuple, dtype: Any = None) -> np.ndarray:
    """The host array of ``shape`` that :func:`_split` cut into ``parts``."""
    if len(parts) == 1:
        whole = np.asarray(parts[0])
    else:
        whole = np.concatenate([np.ravel(p) for p in parts])
    return (whole if dtype is None else whole.astype(dtype, copy=False)).reshape(shape)


class DistStore(KVStore):
    """A ``dist_*`` store: rank ``rank`` of ``num_workers`` on shared servers.

    Make one with ``labkv.create('dist_sync', cluster=handle)`` (the notebook
    is rank 0 of 1) or get one per rank from :func:`labkv.cluster.run`.
    """

    def __init__(
        self,
        spec: StoreSpec,
        servers: list[Any],
        rank: int = 0,
        num_workers: int = 1,
        *,
        owner: bool = True,
        handle: ClusterHandle | None = None,
        futures: list[Any] | None = None,
    ):
        super().__init__(spec.kind, spec.name or spec.kind)
        self._id = spec.store_id
        self._spec, self._servers = spec, list(servers)
        self._rank, self._num_workers, self._owner = rank, num_workers, owner
        self._handle, self._futures = handle, futures
        if handle is not None:  # the notebook's store: events come from the servers
            self.events = ClusterBus(self._id, self._set_streaming)
        else:
            self.events = EventBus(self._id)
        self._sender = uuid.uuid4().hex
        self._sent = [0] * spec.num_servers
        self._inflight: list[tuple[int, Any]] = []
        # Held pushes: (server, message, its future in _inflight, when held); the
        # rank's thread appends and takes them, the loop's timer takes them too.
        self._held: list[tuple[int, Any, concurrent.futures.Future, float]] = []
        self._held_lock = threading.Lock()
        self._timer_armed = False
        self._last_held = 0.0
        self._pieces: dict[Key, list[Piece]] = {}
        self._event_barrier = EventBarrier(spec.group, rank, num_workers, spec.timeout)
        self._local: list[Server | None] = [None] * spec.num_servers
        self._worker = self._loop = None
        self._closed = False
        # With compression: per key, the residuals its last push replaced and
        # that push's sequence number per server (restored if that push fails).
        self._residual_undo: dict[Key, tuple[dict, dict[int, int]]] = {}
        if handle is None:  # a rank: servers on its own Dask worker are called in-process
            self._find_local_servers()

    def _find_local_servers(self) -> None:
        try:
            from distributed import get_worker

            worker = get_worker()
        except (ImportError, ValueError):  # not in a Dask task
            return
        loop = getattr(worker.loop, "asyncio_loop", None)
        if loop is None or threading.get_ident() == getattr(worker, "thread_id", None):
            return  # on the loop's own thread a blocking wait would deadlock
        for s, actor in enumerate(self._servers):
            if self._spec.server_addresses[s] != worker.address:
                continue
            local = worker.state.actors.get(getattr(actor, "key", None))
            if isinstance(local, Server):
                self._local[s] = local
        self._worker, self._loop = worker, loop

    # -- identity ----------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This worker's rank among the store's ``num_workers``."""
        return self._rank

    @property
    def num_workers(self) -> int:
        """How many ranks push to the servers (a dist_sync round waits for all)."""
        return self._num_workers

    @property
    def staleness(self) -> int | None:
        """dist_ssp: how many rounds a rank may run ahead of the slowest rank
        (a pull at clock c waits until every rank has pushed c - staleness
        times); None for the other types.

        >>> labkv.create("dist_ssp", staleness=2).staleness  # doctest: +SKIP
        2
        """
        return self._spec.staleness

    @property
    def num_servers(self) -> int:
        """How many server shards hold the keys."""
        return self._spec.num_servers

    def __repr__(self) -> str:
        return (
            f"<labkv.KVStore type={self._type!r} rank={self._rank}/{self._num_workers} "
            f"servers={self.num_servers} keys={len(self._meta)} id={self._id}>"
        )

    # -- talking to servers ------------------------------------------------------------
    def _lost(self, s: int, exc: BaseException) -> ClusterError:
        return ClusterError(
            f"server {s} on Dask worker {self._spec.server_addresses[s]} is lost "
            f"(its keys' values and optimizer states are gone): {exc}"
        )

    def _call(self, s: int, method: str, *args: Any) -> Any:
        """Call a server method: a future with ``result(timeout)`` and ``done()``.

        From a rank (a Dask task), the call is a coroutine put on the worker's
        event loop with ``run_coroutine_threadsafe``: one hand-off to the loop,
        and a finished call's result is read without another (an ``Actor``
        future's ``result()`` always goes through the loop). A server on the
        rank's own worker is called in-process: no serialisation and no loopback
        TCP (Dask's actor calls take a socket to the worker's own address), the
        arguments travel by reference and the server copies what it keeps
        (``borrowed`` pushes). Other servers get Dask's ``actor_execute``
        message, as an ``Actor`` sends it. The notebook uses the ``Actor``s.

        Held pushes are sent first (a pull takes them along instead, see
        :meth:`_pull_impl`), so every call sees this rank's earlier pushes."""
        if self._held and method != "pull":
            self._release()
        return self._send(s, method, *args)

    def _coro(self, s: int, method: str, args: tuple) -> Any:
        """The coroutine of a rank's call (run on the worker's loop); raises at
        once when the server is known to be lost."""
        actor = self._servers[s]
        self._raise_if_lost(s)
        local = self._local[s]
        if local is not None and method in _LOCAL_METHODS:
            if self._worker.state.actors.get(actor.key) is not local:
                raise self._lost(s, RuntimeError("the server actor is gone from its worker"))
            return getattr(local, method)(*args)
        return self._remote(s, method, args)

    def _raise_if_lost(self, s: int) -> None:
        """Raise when the scheduler has reported server ``s``'s worker lost."""
        future = getattr(self._servers[s], "_future", None)
        if future is not None and future.status not in ("finished", "pending"):
            raise self._lost(s, RuntimeError(f"Worker holding Actor was lost ({future.status})"))

    def _send(self, s: int, method: str, *args: Any) -> Any:
        """:meth:`_call` without sending the held pushes first."""
        if self._closed:
            raise ClusterError(f"the store {self._id} is closed (its servers were released)")
        if self._loop is not None:
            return asyncio.run_coroutine_threadsafe(self._coro(s, method, args), self._loop)
        try:
            return getattr(self._servers[s], method)(*args)
        except (OSError, RuntimeError) as exc:  # "Worker holding Actor was lost"
            raise self._lost(s, exc) from exc

    async def _remote(self, s: int, method: str, args: tuple) -> Any:
        """What ``Actor.<method>(*args)`` sends, awaited on the worker's loop."""
        sealed = [encode(a) if method in _SEALED and isinstance(a, tuple) else a for a in args]
        address, actor_key = self._spec.server_addresses[s], self._servers[s].key
        return await execute_on(self._worker, address, actor_key, method, sealed)

    def _wait_all(self, calls: list[tuple[int, Any]], what: str) -> list[Any]:
        """Results of in-flight server calls, in order; every wait is bounded.

        A call to a server whose worker died can sit in Dask's connect retries
        for up to its connect timeout, so the wait looks every ``_POLL_S`` at
        whether the scheduler has reported the server lost."""
        deadline = time.monotonic() + self._spec.timeout + _GRACE_S
        results, first_error = [], None
        for s, future in calls:
            # After a failed call the others are still waited for: a server must
            # have answered this call before the next one asks it again (a failed
            # update is reported once, to whichever call of the rank comes first).
            try:
                results.append(self._wait_one(s, future, deadline, what))
            except Exception as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        return results

    def _wait_one(self, s: int, future: Any, deadline: float, what: str) -> Any:
        while True:
            try:
                return future.result(timeout=min(_POLL_S, max(0.0, deadline - time.monotonic())))
            except ClusterError:
                raise
            except TIMEOUTS as exc:
                if hasattr(exc, "_labkv_server"):  # a server's own answer: raise it as it is
                    raise
                self._raise_if_lost(s)
                if time.monotonic() >= deadline:
                    raise ClusterError(
                        f"server {s} on {self._spec.server_addresses[s]} did not answer "
                        f"{what} within {self._spec.timeout + _GRACE_S:g} s"
                    ) from exc
            except Exception as exc:
                if hasattr(exc, "_labkv_server"):  # raised by the server: an updater's error
                    self._restore_residuals(exc)
                    raise
                if isinstance(exc, OSError) or "Actor was lost" in str(exc):
                    raise self._lost(s, exc) from exc
                raise

    def _residuals_committed(self, replaced: dict) -> None:
        for key in {slot[0] for slot in replaced}:
            mine = {slot: r for slot, r in replaced.items() if slot[0] == key}
            pushed = {p.server: self._sent[p.server] - 1 for p in self._pieces[key]}
            self._residual_undo[key] = (mine, pushed)

    def _restore_residuals(self, exc: BaseException) -> None:
        """An update of keys this rank pushed failed on a server: put back the
        compression residuals of those keys whose last push it was."""
        failed = getattr(exc, "_labkv_update", None)
        if failed is None or self._compression is None:
            return
        for key, seq in failed["seqs"].items():
            undo = self._residual_undo.get(key)
            if undo is not None and undo[1].get(failed["server"]) == seq:
                self._compression.restore(undo[0])
                del self._residual_undo[key]

    # -- held pushes ---------------------------------------------------------------
    def _hold(self, s: int, msg: Any) -> None:
        """Hold a push message for server ``s`` back, to fold it into this rank's
        next pull of that server (:meth:`_pull_impl`); any other call sends it
        first (:meth:`_call`, :meth:`_flush`), and if none comes, the timer on the
        worker's loop (:meth:`_tick`) sends it after ``_HOLD_S``. Its future
        joins ``_inflight``, so its error surfaces as a sent push's would."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        with self._held_lock:
            now = time.monotonic()
            self._held.append((s, msg, done, now))
            self._last_held = now
            arm, self._timer_armed = not self._timer_armed, True
        self._inflight.append((s, done))
        if arm:  # once per burst of pushes: the timer re-arms itself while they go on
            self._loop.call_soon_threadsafe(self._tick)

    def _take_held(self) -> list[tuple[int, Any, concurrent.futures.Future, float]]:
        with self._held_lock:
            held, self._held = self._held, []
        return held

    def _release(self, held: list | None = None) -> None:
        """Send held pushes (default: all) as push calls, in order."""
        _dispatch(
            self._take_held() if held is None else held,
            lambda s, msg: self._send(s, "push", msg),
        )

    def _tick(self) -> None:
        """The hold timer, on the worker's loop: send the held pushes once the
        oldest has waited ``_HOLD_S``; while pushes keep coming, look again
        ``_HOLD_S`` after the latest (no hand-off to the loop per push)."""
        with self._held_lock:
            now = time.monotonic()
            since = self._held[0][3] if self._held else self._last_held
            if now - since < _HOLD_S:
                self._loop.call_later(since + _HOLD_S - now, self._tick)
                return
            held, self._held = self._held, []
            self._timer_armed = False
        _dispatch(held, lambda s, msg: asyncio.ensure_future(self._coro(s, "push", (msg,))))

    def _flush(self) -> None:
        """Wait for the pushes still in flight (raising their errors)."""
        if self._held:
            self._release()
        inflight, self._inflight = self._inflight, []
        self._wait_all(inflight, "a push")

    def _reap(self) -> None:
        """Raise the error of a finished in-flight push, if any; keep the rest."""
        if any(f.done() for _, f in self._inflight):
            done = [(s, f) for s, f in self._inflight if f.done()]
            self._inflight = [(s, f) for s, f in self._inflight if not f.done()]
            self._wait_all(done, "a push")

    def _all_servers(self, method: str, *args: Any) -> list[Any]:
        calls = [(s, self._call(s, method, *args)) for s in range(self.num_servers)]
        return self._wait_all(calls, method)

    # -- keys ------------------------------------------------------------------------
    def _learn(self, key: Key, shape: tuple, dtype: Any) -> None:
        size = int(np.prod(shape, dtype=np.int64))
        self._pieces[key] = place(key, size, self.num_servers, self._spec.bigarray_bound)
        self._meta[key] = (tuple(shape), np.dtype(dtype))
        if self._key_kind is None:
            self._key_kind = type(key)

    def _check_known(self, keys: list[Key]) -> None:
        # A key another rank (or the notebook) initialised is known to the
        # servers but not yet to this rank: ask them once, on this miss path only.
        self._check_key_kinds(keys)
        unknown = [k for k in keys if k not in self._meta]
        if unknown:
            for found in self._all_servers("keys", unknown):
                for k, (shape, dtype) in found.items():
                    if k not in self._meta:
                        self._learn(k, shape, dtype)
        super()._check_known(keys)

    def _init_impl(self, items: list[tuple[Key, Any]]) -> None:
        placed = {
            k: place(k, int(a.size), self.num_servers, self._spec.bigarray_bound) for k, a in items
        }
        per_server: dict[int, list] = defaultdict(list)
        if self._owner:
            for key, array in items:
                host = _host(array)
                for s, piece in _split(host, placed[key]):
                    per_server[s].append(InitItem(key, piece, tuple(host.shape), host.dtype.str))
            calls = [(s, self._call(s, "init", batch)) for s, batch in per_server.items()]
            self._wait_all(calls, "init")
        else:
            for key, _ in items:
                for p in placed[key]:
                    per_server[p.server].append(key)
            calls = [(s, self._call(s, "wait_keys", keys)) for s, keys in per_server.items()]
            for found in self._wait_all(calls, "init (waiting for rank 0)"):
                for key, array in items:
                    if key in found:
                        shape, dtype = found[key]
                        if tuple(shape) != tuple(array.shape) or np.dtype(dtype) != array.dtype:
                            raise ValueError(
                                f"key {key!r} was initialised by rank 0 with shape {tuple(shape)} "
                                f"and dtype {np.dtype(dtype)}; this rank gave {tuple(array.shape)} "
                                f"{array.dtype}"
                            )
        self._pieces.update(placed)

    # -- push and pull -------------------------------------------------------------
    def _push_impl(self, items: Items) -> None:
        self._reap()
        per_server: dict[int, list] = defaultdict(list)
        nbytes = 0
        compression = self._compression
        for key, values in items:
            if compression is not None:  # each device's values, 2 (or 1) bits each
                for s, codes in self._wire_pieces(compression, key, values):
                    nbytes += codes.nbytes
                    per_server[s].append((key, codes))
                continue
            shape, dtype = self._meta[key]
            if len(values) == 1:
                value = values[0]
            else:  # sum the per-device values here, on their device when they share one
                value = empty(shape, dtype, device_of(values[0]))
                sum_into(value, values)
            value = _host(value)
            nbytes += value.nbytes
            for s, piece in _split(value, self._pieces[key]):
                per_server[s].append((key, piece))
        wait = nbytes >= _ACK_ABOVE
        calls, hold = [], []
        for s, batch in per_server.items():
            seq = self._sent[s]
            self._sent[s] += 1
            msg = self._push_message(s, seq, batch, copy=not wait, compression=compression)
            # Held: a copied push to a server on this worker, or one that travels as
            # one frame (folded into a pull, it keeps that pull one pickled frame).
            if not wait and self._loop is not None:
                if self._local[s] is not None:
                    hold.append((s, msg))
                    continue
                if sealable(msg):
                    hold.append((s, encode(msg)))
                    continue
            calls.append((s, self._call(s, "push", msg)))
        for s, msg in hold:  # after the calls above: _call sends what was held first
            self._hold(s, msg)
        if wait:
            self._flush()
            self._wait_all(calls, "push")
        else:
            self._inflight.extend(calls)

    def _wire_pieces(
        self, compression: GradientCompression, key: Key, values: list[Any]
    ) -> list[tuple[int, np.ndarray]]:
        """``(server, codes)`` of a compressed push of ``key``: per piece, every
        device's quantised values packed (:func:`labkv.compression.to_wire`); the
        server unpacks and sums them as this rank would have (pushes shrink 16x
        for float32 at 2 bits; pulls stay uncompressed, as in MXNet)."""
        pieces = self._pieces[key]
        per_device = [_split(_host(v), pieces) for v in values]
        return [
            (
                p.server,
                to_wire(compression.type, compression.threshold, [d[i][1] for d in per_device]),
            )
            for i, p in enumerate(pieces)
        ]

    def _push_message(
        self,
        s: int,
        seq: int,
        batch: list[tuple[Key, Any]],
        copy: bool,
        compression: GradientCompression | None = None,
    ) -> Push:
        """One server's push message: the small values packed into one buffer (a
        copy), the big ones as they are, or copied when ``copy`` (a push not
        waited for: the caller may reuse its arrays at once). With
        ``compression`` every value is the packed codes of its devices
        (:meth:`_wire_pieces`, fresh arrays: never copied nor borrowed)."""
        keys = [k for k, _ in batch]
        arrays = [v for _, v in batch]
        codes, dtypes = None, None
        if compression is not None:
            copy = False
            codes = Codes(compression.type, compression.threshold, {k: len(v) for k, v in batch})
        else:
            meta = self._meta
            small = [(k, v) for k, v in batch if v.nbytes < PACK_BELOW]
            if any(v.dtype != meta[k][1] for k, v in small):
                dtypes = [v.dtype.str for _, v in small]
        values = pack_values(arrays, np.array if copy else _same)
        borrowed = not copy and codes is None and self._local[s] is not None
        header = PushHeader(
            self._sender, self._rank, seq, keys, dtypes, values.big, borrowed, codes
        )
        return Push(header, values.packed, values.bigs)

    def _piece_spec(self, s: int, key: Key) -> tuple[np.dtype, tuple[int, ...]]:
        """``(dtype, shape)`` of the piece of ``key`` that server ``s`` holds."""
        shape, dtype = self._meta[key]
        pieces = self._pieces[key]
        if len(pieces) > 1:
            p = pieces[s]  # a sliced key has slice s on server s
            shape = (p.stop - p.start,)
        return dtype, shape

    def _pull_impl(self, items: Items) -> None:
        per_server: dict[int, dict[Key, None]] = defaultdict(dict)  # ordered sets
        for key, _ in items:
            for p in self._pieces[key]:
                per_server[p.server][key] = None
        servers = list(per_server)
        carried: dict[int, list] = defaultdict(list)
        if self._held:  # this pull's servers get their held pushes with it; others, now
            others = []
            for entry in self._take_held():
                if entry[0] in per_server:
                    carried[entry[0]].append(entry[1])
                    entry[2].set_result(None)  # the pull answers for it from now on
                else:
                    others.append(entry)
            self._release(others)
        calls = [
            (
                s,
                self._send(
                    s,
                    "pull",
                    Pull(self._sender, self._sent[s], list(per_server[s]), tuple(carried[s])),
                ),
            )
            for s in servers
        ]
        self._flush()  # waits concurrently with the pulls: both are already sent
        got: dict[tuple[int, Key], Any] = {}
        for s, reply in zip(servers, self._wait_all(calls, "pull"), strict=True):
            lookup = functools.partial(self._piece_spec, s)
            for key, value in values_items(per_server[s], decode_values(reply), lookup):
                got[(s, key)] = value
        for key, outs in items:
            pieces = self._pieces[key]
            if len(pieces) == 1:
                value = got[(pieces[0].server, key)]
                for out in outs:
                    copy_into(out, value)
                continue
            whole = None
            for out in outs:
                if type(out) is np.ndarray and out.flags.c_contiguous:
                    flat = out.reshape(-1)  # a view: the slices go straight into out
                    for p in pieces:
                        np.copyto(flat[p.start : p.stop], got[(p.server, key)], casting="unsafe")
                    continue
                if whole is None:
                    whole = _join([got[(p.server, key)] for p in pieces], *self._meta[key])
                copy_into(out, whole)

    def _new_out(self, key: Key) -> Any:
        shape, dtype = self._meta[key]
        return np.empty(shape, dtype)

    def peek(self, key: Key) -> np.ndarray:
        """``key``'s value as the servers hold it now, without a pull: no event,
        no waiting for a round, and safe from another thread (a monitor's). In
        dist_sync it may be a round behind what a pull after a push returns.

        >>> kv.peek("w")  # doctest: +SKIP
        array([3., 3., 3.], dtype=float32)
        """
        self._check_known([key])
        pieces = self._pieces[key]
        calls = [(p.server, self._call(p.server, "peek", [key])) for p in pieces]
        values = [reply[0] for reply in self._wait_all(calls, "peek")]
        return _join(values, *self._meta[key])

    # -- updaters, optimizers, states -------------------------------------------------
    def _set_updater_impl(self, updater: Callable) -> None:
        # A custom updater travels pickled (cloudpickle, as Dask pickles): pickled
        # here, so that one that cannot travel is refused at once, in the caller.
        try:
            blob = cloudpickle.dumps(updater)
        except Exception as exc:
            raise TypeError(
                f"the updater cannot be sent to the servers: it cannot be pickled "
                f"({type(exc).__name__}: {exc}); give a function, or an object without "
                "locks, open files or sockets"
            ) from exc
        if self._owner:
            self._all_servers("set_updater", blob)

    def _set_optimizer_impl(self, optimizer: Optimizer) -> None:
        if self._owner:  # an optimizer travels as its config: data, not code
            self._all_servers("set_optimizer", optimizer.to_config())

    def _optimizer_states(self) -> tuple[int, dict, dict]:
        self._flush()
        gathered = self._all_servers("get_states")
        counts: dict[Any, int] = {}
        for got in gathered:
            for k, c in got.counts.items():
                counts[k] = max(c, counts.get(k, 0))
        states: dict[Key, tuple] = {}
        for key, pieces in self._pieces.items():
            parts = [gathered[p.server].states.get(key) for p in pieces]
            if any(part is None for part in parts):
                continue
            shape = self._meta[key][0]
            states[key] = tuple(
                _join([part[j] for part in parts], shape) for j in range(len(parts[0]))
            )
        return max(g.num_update for g in gathered), counts, states

    def _load_optimizer_states(self, num_update: int, counts: dict, states: dict) -> None:
        server_counts: list[dict] = [{} for _ in range(self.num_servers)]
        server_states: list[dict] = [{} for _ in range(self.num_servers)]
        for key, count in counts.items():
            for p in self._pieces[key]:
                server_counts[p.server][key] = count
        for key, state in states.items():
            split = [dict(_split(np.asarray(a), self._pieces[key])) for a in state]
            for p in self._pieces[key]:
                server_states[p.server][key] = tuple(parts[p.server] for parts in split)
        calls = [
            (s, self._call(s, "set_states", num_update, server_counts[s], server_states[s]))
            for s in range(self.num_servers)
        ]
        self._wait_all(calls, "load_optimizer_states")

    # -- barrier, placement, events ------------------------------------------------------
    def _barrier_impl(self) -> None:
        self._flush()
        client = self._handle.client if self._handle is not None else None
        self._event_barrier.wait(client)

    def placement(self) -> dict[Key, list[dict[str, Any]]]:
        """Where every key lives, in the local store's format: per key, its
        pieces ``{'server': s, 'device': 'cpu(0)@<worker address>', 'start': a,
        'stop': b}`` (flat element offsets; one piece, or one slice per server
        for values of at least ``bigarray_bound`` elements)."""
        return {
            key: [
                {
                    "server": p.server,
                    "device": f"{self._server_device(p.server)}@"
                    f"{self._spec.server_addresses[p.server]}",
                    "start": p.start,
                    "stop": p.stop,
                }
                for p in self._pieces[key]
            ]
            for key in self._meta
        }

    def _server_device(self, s: int) -> str:
        devices = self._spec.server_devices
        return devices[s] if devices else "cpu(0)"

    def server_load(self) -> list[dict[str, Any]]:
        """Per server: its device, bytes in/out so far, keys and bytes held,
        messages received."""
        return self._all_servers("load")

    def _set_streaming(self, on: bool) -> None:
        client = self._handle.client
        topic = topic_of(self._id)
        if on:
            client.subscribe_topic(topic, self.events.receive)
        else:
            client.unsubscribe_topic(topic)
        detail = (self.events.detail_interval, self.events.detail_burst)
        calls = [(s, self._call(s, "streaming", on, *detail)) for s in range(self.num_servers)]
        # Wait, so that the next push is streamed; but never on the client's own
        # loop thread (a subscriber added from an event handler): that would deadlock.
        loop_thread = getattr(client.loop.asyncio_loop, "_thread_id", None)
        if loop_thread != threading.get_ident():
            self._wait_all(calls, "streaming")

    def close(self) -> None:
        """Release the servers this store started (their keys are dropped); a
        later call on the store raises ``ClusterError`` saying it is closed."""
        if self._futures and self._handle is not None:
            self._closed = True
            if self.events.active:
                self._handle.client.unsubscribe_topic(topic_of(self._id))
            self._handle.client.cancel(self._futures)
            self._futures = None

    def __enter__(self) -> DistStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_cluster_args(cluster: Any, timeout: Any) -> None:
    """Refuse a ``cluster`` that is not a handle and a ``timeout`` that is not
    a positive number of seconds, before anything starts."""
    if cluster is not None and not isinstance(cluster, ClusterHandle):
        hint = f" (connect to it first: labkv.cluster.connect({cluster!r}))"
        raise TypeError(
            f"cluster must be a ClusterHandle from labkv.cluster.connect, got "
            f"{type(cluster).__name__}{hint if isinstance(cluster, str) else ''}"
        )
    number = isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
    if not number or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")


def create_store(
    kind: str,
    cluster: ClusterHandle | None = None,
    num_servers: int | None = None,
    bigarray_bound: int = DEFAULT_BIGARRAY_BOUND,
    timeout: float = DEFAULT_TIMEOUT_S,
    server_workers: list[str] | None = None,
    server_device: str = "auto",
    staleness: int | None = None,
) -> DistStore:
    """A ``dist_*`` store for this process (rank 0 of 1): what
    ``labkv.create('dist_sync', cluster=handle, num_servers=S)`` calls.
    ``kind`` is any distributed type name ``labkv.create`` takes (MXNet's
    ``'dist'`` and ``'dist_sync_device'`` too).

    ``cluster``: a handle from :func:`labkv.cluster.connect` (default: the
    embedded cluster, started on first use). ``num_servers`` defaults to the
    number of Dask workers; ``server_workers`` pins servers to given workers
    (round-robin). ``timeout`` bounds every cross-process wait.
    ``server_device``: where servers keep their values: ``'auto'`` (the
    worker's GPU when it has one, else the host), ``'cpu'``, ``'gpu'`` or
    ``'gpu(i)'`` (see ``kv.placement()``). ``staleness`` (``'dist_ssp'``
    only, required there): a pull by a rank that has pushed a key ``c`` times
    waits until every rank has pushed it ``c - staleness`` times (0: as
    dist_sync; large: as dist_async); see ``docs/cluster.md``.

    >>> import labkv
    >>> kv = labkv.create("dist_sync", cluster=handle, num_servers=2)  # doctest: +SKIP
    >>> kv.rank, kv.num_workers  # doctest: +SKIP
    (0, 1)
    """
    kind, name = dist_kind(kind), kind.lower()
    check_cluster_args(cluster, timeout)
    staleness = check_staleness(kind, staleness)
    if num_servers is not None and (not isinstance(num_servers, int) or num_servers < 1):
        raise ValueError(f"num_servers must be a positive int, got {num_servers!r}")
    if int(bigarray_bound) < 1:
        raise ValueError(f"bigarray_bound must be positive, got {bigarray_bound!r}")
    parse_server_device(server_device)
    handle = cluster if cluster is not None else default_handle()
    workers = server_workers or handle.workers()
    num_servers = num_servers or len(workers)
    futures, actors, spec = start_servers(
        handle,
        kind,
        num_servers,
        1,
        timeout,
        workers,
        server_device,
        bigarray_bound,
        name=name,
        staleness=staleness,
    )
    return DistStore(spec, actors, 0, 1, owner=True, handle=handle, futures=futures)
