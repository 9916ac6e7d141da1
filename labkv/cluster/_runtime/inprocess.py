"""Servers in this process, for tests, no Dask at all: real ``Server`` objects on
an asyncio loop in a thread of the test process (:class:`InProcessServers`),
reached through :class:`InProcessLink` and finding their peers through
:class:`InProcessHost`; and replicated servers (:class:`InProcessReplicas`)
reached through :class:`~labkv.cluster._rank.failover.ReplicatedLink` over in-process links, whose
replicas can die (:meth:`InProcessReplicas.kill`) or be added
(:meth:`InProcessReplicas.reseed`).

Faults are injected where ps-lite injects them (``PS_DROP_MSG``): in the
transport, never in the servers. A rank's link can lose the reply of a call
(:attr:`InProcessLink.die_after`); the calls between servers can be dropped
(:meth:`InProcessHost.drop`), held back (:meth:`InProcessHost.delay`), or be
the last a replica makes (:meth:`InProcessHost.die`); a server that dies
while it runs a call never answers it. Each hook takes the
calls of one method, from one server (``caller``) and to one (``peer``) if
told, matching ``match(args)`` if given, lets ``skip`` of them pass and acts
on the next ``times``.
"""

from __future__ import annotations

import asyncio
import pickle
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._protocol.messages import Peer
from .._rank.failover import ReplicatedLink
from .._transport.base import Host, ServerLink, _encoded, wait_all

#: Server methods whose arguments the callee keeps: they travel as copies (a
#: backup keeps the arrays it applies, a seeded replica its snapshot).
_COPIED = frozenset({"replicate", "seed"})


@dataclass
class Fault:
    """One fault on the calls between in-process servers (see module doc).
    ``action``: ``"drop"`` (the call never arrives, nor its reply), ``"delay"``
    (it arrives ``seconds`` later, or once :meth:`release` is called), or
    ``"die"`` (its caller dies: ``when`` ``"before"`` the call leaves, once it
    is ``"sent"``, or once it is ``"answered"``). ``seen``: the matching calls so far."""

    method: str
    action: str
    caller: str | None = None
    peer: str | None = None
    match: Callable[[list], bool] | None = None
    skip: int = 0
    times: int | None = 1
    seconds: float | None = None
    when: str = "before"
    seen: int = 0
    _released: threading.Event = field(default_factory=threading.Event, repr=False)

    def hits(self, caller: str | None, peer: str, method: str, args: list) -> bool:
        """Whether this call is one to act on (counting it if it matches)."""
        if method != self.method or self.caller not in (None, caller):
            return False
        if self.peer not in (None, peer) or (self.match is not None and not self.match(args)):
            return False
        self.seen += 1
        acted = self.seen - self.skip
        return acted >= 1 and (self.times is None or acted <= self.times)

    def release(self) -> None:
        """Let the held calls of a ``"delay"`` fault without ``seconds`` arrive."""
        self._released.set()

    async def held(self) -> None:
        if self.seconds is not None:
            await asyncio.sleep(self.seconds)
            return
        while not self._released.is_set():
            await asyncio.sleep(0.005)


async def _never() -> None:
    await asyncio.get_running_loop().create_future()


class InProcessHost(Host):
    """Servers in this process, found by their ``actor_key`` (their name). A
    dead server is unreachable (``dead``: calls to it fail); one that died of
    a :meth:`die` fault also reaches nobody (``mute``). Each server gets its
    own view (:meth:`of`), so that a fault knows who calls."""

    def __init__(self) -> None:
        self.servers: dict[str, Any] = {}
        self.events: list[tuple[str, Any]] = []
        self.dead: set[str] = set()
        self.mute: set[str] = set()
        self.faults: list[Fault] = []
        self.on_death: list[Callable[[str], None]] = []

    def of(self, name: str) -> PeerHost:
        """What the server ``name`` sees of this host."""
        return PeerHost(self, name)

    def log_event(self, topic: str, batch: Any) -> None:
        self.events.append((topic, batch))

    def drop(self, method: str, **which: Any) -> Fault:
        """The matching calls of ``method`` never arrive (nor do their replies)."""
        return self._add(Fault(method, "drop", **which))

    def delay(self, method: str, seconds: float | None = None, **which: Any) -> Fault:
        """The matching calls of ``method`` arrive ``seconds`` late (None: once released)."""
        return self._add(Fault(method, "delay", seconds=seconds, **which))

    def die(self, caller: str, method: str, when: str = "before", **which: Any) -> Fault:
        """Server ``caller`` dies at its matching call of ``method`` (see :class:`Fault`)."""
        return self._add(Fault(method, "die", caller=caller, when=when, **which))

    def _add(self, fault: Fault) -> Fault:
        self.faults.append(fault)
        return fault

    def kill(self, name: str, mute: bool = False) -> None:
        """Server ``name`` is unreachable from now on; ``mute``: it reaches nobody either."""
        self.dead.add(name)
        if mute:
            self.mute.add(name)
        for notify in self.on_death:
            notify(name)

    def call_peer(self, peer: Peer, method: str, args: list, caller: str | None = None) -> Any:
        if caller in self.mute:
            raise OSError(f"{caller} is dead")
        if peer.actor_key in self.dead:
            raise OSError(f"{peer.actor_key} is dead")
        fault = next((f for f in self.faults if f.hits(caller, peer.actor_key, method, args)), None)
        if fault is not None and fault.action == "die" and fault.when == "before":
            self.kill(caller, mute=True)
            raise OSError(f"{caller} died before calling {method}")
        if method in _COPIED:
            args = pickle.loads(pickle.dumps(args, protocol=5))
        if fault is None:
            return getattr(self.servers[peer.actor_key], method)(*args)
        if fault.action == "drop":
            return _never()
        server = self.servers[peer.actor_key]
        if fault.action == "delay":
            return self._later(fault, server, method, args)
        call = getattr(server, method)(*args)
        if fault.when == "sent":
            self.kill(caller, mute=True)
            return call
        return self._then_die(caller, call)

    async def _later(self, fault: Fault, server: Any, method: str, args: list) -> Any:
        await fault.held()
        return await getattr(server, method)(*args)

    async def _then_die(self, caller: str, call: Any) -> Any:
        try:
            return await call
        finally:
            self.kill(caller, mute=True)


class PeerHost(Host):
    """An :class:`InProcessHost` as the server ``name`` sees it."""

    def __init__(self, shared: InProcessHost, name: str) -> None:
        self.shared, self.name = shared, name

    def log_event(self, topic: str, batch: Any) -> None:
        self.shared.log_event(topic, batch)

    def call_peer(self, peer: Peer, method: str, args: list) -> Any:
        return self.shared.call_peer(peer, method, args, caller=self.name)


class InProcessLink(ServerLink):
    """A link to a :class:`~labkv.cluster._server.actor.Server` running on ``loop`` in this process.

    ``wire=True`` sends every argument and result through pickle as Dask would
    (the server gets its own copies, messages travel encoded); ``wire=False``
    hands them over by reference, as :class:`SameProcessLink` does."""

    def __init__(self, sid: int, server: Any, loop: asyncio.AbstractEventLoop, wire: bool = True):
        super().__init__(sid, "in-process")
        self.server, self.loop, self.wire = server, loop, wire
        self.local = None if wire else server
        self.gone = False
        self.die_after: str | None = None  # a test's fault: lost once this method ran

    def call(self, method: str, *args: Any) -> Any:
        self._raise_if_lost()
        return asyncio.run_coroutine_threadsafe(self._coro(method, args), self.loop)

    async def _coro(self, method: str, args: tuple) -> Any:
        if self.wire:
            args = pickle.loads(pickle.dumps(_encoded(method, args), protocol=5))
        try:
            result = await getattr(self.server, method)(*args)
        except Exception:
            self._answered(method)
            raise
        self._answered(method)
        if method == self.die_after:  # applied, but the reply never arrives
            self.gone = True
            raise OSError(f"the test cut the link after {method}")
        return pickle.loads(pickle.dumps(result, protocol=5)) if self.wire else result

    def _answered(self, method: str) -> None:
        """A server that died while it ran the call never answers it (what it
        did after its death, a zombie's work, reaches no one)."""
        if self.gone:
            raise OSError(f"the server died before it answered {method}")

    def lost(self) -> str | None:
        return "the test said so" if self.gone else None


class InProcessServers:
    """``Server`` objects on an asyncio loop in a daemon thread of this process,
    with their links: the cluster's logic without Dask. Use as a context
    manager; ``links`` are what a :class:`~labkv.cluster._rank.dist_store.DistStore` takes."""

    def __init__(self, make: Callable[[int, Host], Any], num_servers: int, wire: bool = True):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.host = InProcessHost()
        self.wire = wire
        self.names: dict[int, str] = {}  # id(server) -> its name
        names = [f"server-{s}" for s in range(num_servers)]
        self.servers = self.start(make, list(range(num_servers)), names)
        peers = [("in-process", name) for name in names]
        self.links = [InProcessLink(s, sv, self.loop, wire) for s, sv in enumerate(self.servers)]
        wait_all([(link, link.call("link", peers)) for link in self.links], "link", 5.0)

    def start(self, make: Callable[[int, Host], Any], sids: list[int], names: list[str]) -> list:
        """Servers ``make(sid, host)`` on the loop, found by the host as ``names``."""

        async def start() -> list[Any]:
            return [make(s, self.host.of(name)) for s, name in zip(sids, names, strict=True)]

        servers = asyncio.run_coroutine_threadsafe(start(), self.loop).result()
        self.host.servers.update(zip(names, servers, strict=True))
        self.names.update((id(sv), name) for sv, name in zip(servers, names, strict=True))
        return servers

    def name_of(self, server: Any) -> str:
        """The name (actor key) of one of these servers."""
        return self.names[id(server)]

    def close(self) -> None:
        """Cancel what still runs on the loop, then stop the loop and its thread."""

        async def cancel_the_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cancel_the_rest(), self.loop).result(timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()

    def __enter__(self) -> InProcessServers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InProcessReplicas(InProcessServers):
    """``num_servers`` server ids of ``replicas`` replicas each, on one loop in
    this process (no Dask): ``replicas_of[s]`` are the server objects of id
    ``s``, primary first; :meth:`rank_links` gives each rank its own links
    (a link keeps its rank's pushes); :meth:`kill` makes a replica die, and so
    does a :meth:`InProcessHost.die` fault."""

    def __init__(
        self, make: Callable[[int, Any], Any], num_servers: int, replicas: int, wire: bool = True
    ):
        super().__init__(make, 0, wire)
        self.host.on_death.append(self._cut)
        self.num_servers, self.made = num_servers, []
        self.make_server = make
        names = [[f"server-{s}-{r}" for r in range(replicas)] for s in range(num_servers)]
        flat = self.start(
            make, [s for s in range(num_servers) for _ in range(replicas)], sum(names, [])
        )
        self.replicas_of = [flat[s * replicas : (s + 1) * replicas] for s in range(num_servers)]
        self.members = [[("in-process", n) for n in row] for row in names]
        self.servers = [row[0] for row in self.replicas_of]
        self._on_loop(
            [
                sv.join_group(self.members[s], r)
                for s, row in enumerate(self.replicas_of)
                for r, sv in enumerate(row)
            ]
        )
        primaries = [m[0] for m in self.members]
        self._on_loop([sv.link(primaries) for row in self.replicas_of for sv in row])
        self.links = self.rank_links()

    def _on_loop(self, coros: list) -> list:
        async def run() -> list:
            return [await c for c in coros]

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=10)

    def _link(self, sid: int, address: str, actor_key: str) -> InProcessLink:
        link = InProcessLink(sid, self.host.servers[actor_key], self.loop, self.wire)
        link.actor_key = actor_key
        if actor_key in self.host.dead:
            link.gone = True
        self.made.append(link)
        return link

    def _cut(self, name: str) -> None:
        """The ranks' links to ``name`` are lost."""
        for link in self.made:
            if link.actor_key == name:
                link.gone = True

    def rank_links(self) -> list[ReplicatedLink]:
        """A fresh set of links for one rank."""
        return [ReplicatedLink(s, self.members[s], self._link) for s in range(self.num_servers)]

    def kill(self, sid: int, replica: int | None = None) -> str:
        """Replica ``replica`` of server ``sid`` dies (default: its current
        primary): unreachable from now on, though it still runs (and calls)."""
        if replica is None:
            name = self.name_of(next(sv for sv in self.servers_by_name(sid) if sv.primary))
        else:
            name = self.members[sid][replica][1]
        self.host.kill(name)
        return name

    def servers_by_name(self, sid: int) -> list[Any]:
        """The live replicas of ``sid``."""
        return [sv for sv in self.replicas_of[sid] if self.name_of(sv) not in self.host.dead]

    def reseed(self, sid: int) -> Any:
        """Start a new replica of ``sid`` and have its primary seed it."""
        n = len(self.members[sid]) + sum(
            1 for k in self.host.servers if k.startswith(f"server-{sid}-")
        )
        name = f"server-{sid}-new{n}"
        (server,) = self.start(self.make_server, [sid], [name])
        primary = next(sv for sv in self.servers_by_name(sid) if sv.primary)
        ((_, group),) = self._on_loop([primary.members()])
        self._on_loop([server.join_group([*group, ("in-process", name)], len(group), False)])
        self._on_loop([primary.add_replica(("in-process", name))])
        self.replicas_of[sid].append(server)
        return server
