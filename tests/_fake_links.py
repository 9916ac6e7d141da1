"""Fake links for the rank side's tests (no server, no loop): replicas that
answer as a replicated server does and record every call, and a plain link
whose futures the test settles."""

from __future__ import annotations

import concurrent.futures

from labkv.cluster._rank.failover import ReplicatedLink
from labkv.cluster._transport.base import ServerLink, SingleServer

SENDER = "rank-a"


class Replica:
    """A fake replica of server 0: answers as a replicated server does, and
    records every call; ``fail`` maps a method to what its calls raise, in
    turn (an exception, or None for a normal answer), ``hang`` the methods
    whose calls never finish."""

    def __init__(self, name: str, members: list[tuple[str, str]]):
        self.name, self.members, self.epoch = name, list(members), 0
        self.calls: list[tuple[str, tuple]] = []
        self.fail: dict[str, list] = {}
        self.hang: set[str] = set()

    def answer(self, method: str, args: tuple):
        self.calls.append((method, args))
        errors = self.fail.get(method)
        if errors:
            error = errors.pop(0)
            if error is not None:
                raise error
        if method == "promote":
            (lost,) = args
            self.members = [m for m in self.members if m not in lost]
            self.epoch += 1
            return self.epoch, self.members
        if method == "members":
            return self.epoch, self.members
        if method in ("push", "pull", "replay"):
            return 0, self.epoch, f"{method} by {self.name}"
        return f"{method} by {self.name}"

    def methods(self) -> list[str]:
        return [m for m, _ in self.calls]


class FakeLink(ServerLink):
    """A member link to a :class:`Replica`: each call's future is settled at once
    (or never, for the replica's ``hang``); ``gone``: the worker is known lost."""

    def __init__(self, sid: int, address: str, replica: Replica):
        super().__init__(sid, address)
        self.replica, self.gone = replica, False

    def call(self, method, *args):
        self._raise_if_lost()
        future = concurrent.futures.Future()
        if method in self.replica.hang:
            self.replica.calls.append((method, args))
            return future
        try:
            future.set_result(self.replica.answer(method, args))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def lost(self):
        return "its worker is gone" if self.gone else None


class Group:
    """Server ``sid`` as ``n`` fake replicas behind one bound :class:`ReplicatedLink`;
    ``heard`` records what its callbacks heard, in order."""

    def __init__(self, n: int = 2, sid: int = 0, alive=None):
        members = [(f"w{i}", f"s{sid}-r{i}") for i in range(n)]
        self.replicas = [Replica(key, members) for _, key in members]
        self.members = {key: (addr, r) for (addr, key), r in zip(members, self.replicas)}
        self.made: list[str] = []
        links = [FakeLink(sid, a, r) for (a, _), r in zip(members, self.replicas)]
        self.link = ReplicatedLink(sid, members, self._make, links, alive=alive)
        self.heard: list[tuple] = []
        self.link.bind(
            SENDER,
            1.0,
            lambda link, old: self.heard.append(("failover", old)),
            lambda link: self.heard.append(("promoted", link.address)),
        )

    def _make(self, sid: int, address: str, key: str) -> ServerLink:
        self.made.append(key)
        if key not in self.members:
            self.members[key] = (address, Replica(key, []))
        return FakeLink(sid, address, self.members[key][1])

    def die(self, i: int) -> None:
        """Replica ``i``'s worker is gone: calls made from now on fail at once."""
        self.link.links[self.link.members[i]].gone = True


class PlainLink(ServerLink):
    """A link to no server: each call's future waits for the test to settle it
    (``futures``, in call order), but a method of ``answers``, answered at once;
    ``kept`` and ``tracked`` record what the rank gave its failover to keep and
    to track."""

    def __init__(self, sid: int, loop=None, answers: dict | None = None):
        super().__init__(sid, f"tcp://worker-{sid}")
        self.loop, self.answers = loop, dict(answers or {})
        self.calls: list[tuple[str, tuple]] = []
        self.futures: list[concurrent.futures.Future] = []
        self.kept: list[tuple[int, object]] = []
        self.tracked: list[tuple[str, object]] = []
        self.failover = RecordingFailover(self)

    def call(self, method, *args):
        self.calls.append((method, args))
        future = concurrent.futures.Future()
        self.futures.append(future)
        if method in self.answers:
            future.set_result(self.answers[method])
        return future


class RecordingFailover(SingleServer):
    """A plain link's failover that records on its link what it was given."""

    def __init__(self, link: PlainLink):
        super().__init__(link.address)
        self.link = link

    def keep(self, seq, msg):
        self.link.kept.append((seq, msg))

    def track(self, method, future):
        self.link.tracked.append((method, future))
        return future
