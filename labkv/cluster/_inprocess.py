"""Replicated servers in this process, for tests: real ``Server`` replicas on one
asyncio loop, reached through :class:`~._replicas.ReplicatedLink` over in-process
links, and replicas that can die (:meth:`InProcessReplicas.kill`) or be added
(:meth:`InProcessReplicas.reseed`). No Dask."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ._replicas import ReplicatedLink
from ._transport import InProcessHost, InProcessLink, InProcessServers
from ._wire import Peer


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
