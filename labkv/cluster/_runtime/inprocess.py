"""Servers in this process, for tests, no Dask at all: real ``Server`` objects on
an asyncio loop in a thread of the test process (:class:`InProcessServers`),
reached through :class:`InProcessLink` and finding their peers through
:class:`InProcessHost`; and replicated servers (:class:`InProcessReplicas`)
reached through :class:`~labkv.cluster._rank.failover.ReplicatedLink` over in-process links, whose
replicas can die (:meth:`InProcessReplicas.kill`) or be added
(:meth:`InProcessReplicas.reseed`)."""

from __future__ import annotations

import asyncio
import pickle
import threading
from collections.abc import Callable
from typing import Any

from .._protocol.messages import Peer
from .._rank.failover import ReplicatedLink
from .._transport.base import Host, ServerLink, _encoded, wait_all


class InProcessHost(Host):
    """Servers in this process, found by their ``actor_key`` (their name)."""

    def __init__(self) -> None:
        self.servers: dict[str, Any] = {}
        self.events: list[tuple[str, Any]] = []

    def log_event(self, topic: str, batch: Any) -> None:
        self.events.append((topic, batch))

    def call_peer(self, peer: Peer, method: str, args: list) -> Any:
        if method == "replicate":  # a backup keeps the arrays it applies: its own copies
            args = pickle.loads(pickle.dumps(args, protocol=5))
        return getattr(self.servers[peer.actor_key], method)(*args)


class InProcessLink(ServerLink):
    """A link to a :class:`~labkv.cluster._server.actor.Server` running on ``loop`` in this process.

    ``wire=True`` sends every argument and result through pickle as Dask would
    (the server gets its own copies, messages travel encoded); ``wire=False``
    hands them over by reference, as :class:`SameProcessLink` does."""

    def __init__(self, sid: int, server: Any, loop: asyncio.AbstractEventLoop, wire: bool = True):
        super().__init__(sid, "in-process")
        self.server, self.loop, self.wire = server, loop, wire
        self.same_process = not wire
        self.gone = False
        self.die_after: str | None = None  # a test's fault: lost once this method ran

    def call(self, method: str, *args: Any) -> Any:
        self.raise_if_lost()
        return asyncio.run_coroutine_threadsafe(self._coro(method, args), self.loop)

    async def _coro(self, method: str, args: tuple) -> Any:
        if self.wire:
            args = pickle.loads(pickle.dumps(_encoded(method, args), protocol=5))
        result = await getattr(self.server, method)(*args)
        if method == self.die_after:  # applied, but the reply never arrives
            self.gone = True
            raise OSError(f"the test cut the link after {method}")
        return pickle.loads(pickle.dumps(result, protocol=5)) if self.wire else result

    def lost(self) -> str | None:
        return "the test said so" if self.gone else None


class InProcessServers:
    """``Server`` objects on an asyncio loop in a daemon thread of this process,
    with their links: the cluster's logic without Dask. Use as a context
    manager; ``links`` are what a :class:`~labkv.cluster._rank.store.DistStore` takes."""

    def __init__(self, make: Callable[[int, Host], Any], num_servers: int, wire: bool = True):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.host = InProcessHost()
        self.wire = wire
        names = [f"server-{s}" for s in range(num_servers)]
        self.servers = self.start(make, list(range(num_servers)), names)
        peers = [("in-process", name) for name in names]
        self.links = [InProcessLink(s, sv, self.loop, wire) for s, sv in enumerate(self.servers)]
        wait_all([(link, link.call("link", peers)) for link in self.links], "link", 5.0)

    def start(self, make: Callable[[int, Host], Any], sids: list[int], names: list[str]) -> list:
        """Servers ``make(sid, host)`` on the loop, found by the host as ``names``."""

        async def start() -> list[Any]:
            return [make(s, self.host) for s in sids]

        servers = asyncio.run_coroutine_threadsafe(start(), self.loop).result()
        self.host.servers.update(zip(names, servers, strict=True))
        return servers

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


class _MortalHost(InProcessHost):
    """An in-process host whose servers can die: calls to a dead one fail."""

    def __init__(self) -> None:
        super().__init__()
        self.dead: set[str] = set()

    async def alive(self, address: str) -> bool:
        return True  # a dead replica's calls fail at once (call_peer)

    def call_peer(self, peer: Peer, method: str, args: list) -> Any:
        if peer.actor_key in self.dead:
            raise OSError(f"{peer.actor_key} is dead")
        return super().call_peer(peer, method, args)


class InProcessReplicas(InProcessServers):
    """``num_servers`` server ids of ``replicas`` replicas each, on one loop in
    this process (no Dask): ``replicas_of[s]`` are the server objects of id
    ``s``, primary first; :meth:`rank_links` gives each rank its own links
    (a link keeps its rank's pushes); :meth:`kill` makes a replica die."""

    def __init__(
        self, make: Callable[[int, Any], Any], num_servers: int, replicas: int, wire: bool = True
    ):
        super().__init__(make, 0, wire)
        self.host = _MortalHost()
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

    def rank_links(self) -> list[ReplicatedLink]:
        """A fresh set of links for one rank."""
        return [ReplicatedLink(s, self.members[s], self._link) for s in range(self.num_servers)]

    def kill(self, sid: int, replica: int | None = None) -> str:
        """Replica ``replica`` of server ``sid`` dies (default: its current primary)."""
        if replica is None:
            name = next(sv for sv in self.servers_by_name(sid) if sv.primary).me.actor_key
        else:
            name = self.members[sid][replica][1]
        self.host.dead.add(name)
        for link in self.made:
            if link.actor_key == name:
                link.gone = True
        return name

    def servers_by_name(self, sid: int) -> list[Any]:
        """The live replicas of ``sid``."""
        return [sv for sv in self.replicas_of[sid] if sv.me.actor_key not in self.host.dead]

    def reseed(self, sid: int) -> Any:
        """Start a new replica of ``sid`` and have its primary seed it."""
        n = len(self.members[sid]) + sum(
            1 for k in self.host.servers if k.startswith(f"server-{sid}-")
        )
        name = f"server-{sid}-new{n}"
        (server,) = self.start(self.make_server, [sid], [name])
        live = self.servers_by_name(sid)
        group = [tuple(m) for m in live[0].group]
        primary = next(sv for sv in live if sv.primary)
        self._on_loop([server.join_group([*group, ("in-process", name)], len(group), False)])
        self._on_loop([primary.add_replica(("in-process", name))])
        self.replicas_of[sid].append(server)
        return server
