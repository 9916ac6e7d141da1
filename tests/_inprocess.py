"""Real ``Server`` objects on an asyncio loop in the test process (no Dask),
reached through the in-process links of ``labkv.cluster._runtime.inprocess``, driven by
real ``DistStore`` ranks: the cluster's logic in milliseconds."""

from __future__ import annotations

import contextlib
import copy

from labkv._types import SYNC_KINDS
from labkv.cluster._options import StoreSpec
from labkv.cluster._rank.dist_store import DistStore
from labkv.cluster._runtime.inprocess import InProcessReplicas, InProcessServers
from labkv.cluster._server.actor import Server


class InProcessCluster:
    """``num_servers`` in-process servers (``replicas`` copies of each) and
    ``num_workers`` ranks on them; ``group`` is the servers' group, ``ranks``
    the stores, rank 0 first; ``server_device``: where the servers keep their
    values (``labkv.cluster._device``; a GPU one needs CuPy or its stand-in)."""

    def __init__(
        self,
        kind="dist_sync",
        num_servers=2,
        num_workers=2,
        timeout=2.0,
        *,
        replicas=1,
        staleness=None,
        wire=True,
        bigarray_bound=1000,
        replace_hold=0.0,
        server_device="cpu",
    ):
        sync = kind in SYNC_KINDS

        def make(s, host):
            return Server(
                s, "t", num_workers, sync, timeout, "t-topic", server_device, staleness, host=host
            )

        if replicas == 1:
            self.group = InProcessServers(make, num_servers, wire=wire)
            self.servers = self.group.servers

            def links():
                return self.group.links

        else:
            self.group = InProcessReplicas(make, num_servers, replicas, wire=wire)
            links = self.group.rank_links
        spec = StoreSpec(
            kind,
            "t",
            num_servers,
            ["in-process"] * num_servers,
            bigarray_bound,
            timeout,
            staleness=staleness,
            replicas=replicas,
            replica_members=[] if replicas == 1 else [list(m) for m in self.group.members],
            replace_hold=replace_hold,
            server_devices=[sv.device_name for sv in self.group.servers],
        )
        # each rank its own spec, as each Dask task unpickles its own
        self.ranks = [
            DistStore(copy.deepcopy(spec), [], r, num_workers, owner=r == 0, links=links())
            for r in range(num_workers)
        ]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for kv in self.ranks:  # nothing left in flight when the loop stops
            with contextlib.suppress(Exception):
                kv.flush()
        self.group.close()
