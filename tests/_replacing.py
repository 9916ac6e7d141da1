"""A rank that dies mid-run in the in-process cluster, and its replacement: the
harness of the in-process replacement tests (numpy loops and labkv.torch)."""

from __future__ import annotations

import contextlib
import copy
import threading

from labkv.cluster._rank.dist_store import DistStore
from tests._waiting import in_threads


class Died(BaseException):
    """A rank's process ending where it stands (not an Exception: nothing catches it)."""


def replacement(c, rank, incarnation=1):
    """Rank ``rank``'s next incarnation on the servers of the in-process cluster
    ``c`` (as ``run`` starts it), after its lost one is fenced on every replica
    (as the watcher does)."""
    live = c.ranks[1 - rank]
    prefix = f"{live.spec.group}/{rank}.{incarnation - 1}/"
    live._calls.all("fence", prefix, rank, 10.0)
    spec = copy.deepcopy(live.spec)
    links = c.group.rank_links() if hasattr(c.group, "rank_links") else c.group.links
    owner = rank == 0  # as run makes it: the owner's replacement inherits its init
    return DistStore(spec, [], rank, 2, owner=owner, links=links, incarnation=incarnation)


def run_through_a_death(c, fn, lost, at, point, flushed=True, timeout=30.0, **kw):
    """Both ranks of ``c`` run ``fn(kv, die=..., **kw)``; rank ``lost`` dies where
    ``fn`` calls ``die(kv, at, point)``, after what it holds back was sent
    (``flushed``) or with it, and its replacement runs ``fn(again, **kw)`` on.
    Every rank's result (rank 0 first) and the replacement's store."""
    died = threading.Event()

    def die(kv, step, where):
        if kv.rank == lost and kv.incarnation == 0 and step == at and where == point:
            if flushed:
                kv.flush()
            died.set()
            raise Died

    results = {}

    def rank_thread(kv):
        with contextlib.suppress(Died):
            results[kv.rank] = fn(kv, die=die, **kw)

    threads = [threading.Thread(target=rank_thread, args=(kv,), daemon=True) for kv in c.ranks]
    for t in threads:
        t.start()
    assert died.wait(timeout), "the rank never reached its point of death"
    threads[lost].join(10)
    again = replacement(c, lost)
    results[lost] = in_threads(lambda: fn(again, **kw), timeout=timeout)[0]
    threads[1 - lost].join(timeout)
    assert not threads[1 - lost].is_alive(), "the live rank did not finish"
    return [results[0], results[1]], again
