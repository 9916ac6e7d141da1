"""The fault hooks of the in-process transport (``InProcessHost.drop`` / ``delay`` /
``die``), on stand-in servers: which calls a hook takes, and what each does."""

from __future__ import annotations

import asyncio

import pytest

from labkv.cluster._protocol.messages import Peer
from labkv.cluster._runtime.inprocess import InProcessHost


class _Echo:
    """A stand-in server: records the calls it gets."""

    def __init__(self) -> None:
        self.got: list[tuple[str, tuple]] = []

    async def vote(self, *args):
        self.got.append(("vote", args))
        return args

    async def replicate(self, entry):
        self.got.append(("replicate", (entry,)))
        return entry


def _host():
    host = InProcessHost()
    host.servers.update(a=_Echo(), b=_Echo(), c=_Echo())
    deaths = []
    host.on_death.append(deaths.append)
    return host, deaths


B, C = Peer("in-process", "b"), Peer("in-process", "c")


def test_a_dropped_call_never_arrives_and_the_others_do():
    async def main():
        host, _ = _host()
        fault = host.drop("vote", caller="a", peer="b", skip=1)
        a = host.of("a")
        first = await a.call_peer(B, "vote", [0])
        lost = asyncio.ensure_future(a.call_peer(B, "vote", [1]))
        third = await a.call_peer(B, "vote", [2])
        other = await host.of("c").call_peer(B, "vote", [3])  # another caller
        await asyncio.sleep(0.01)
        assert not lost.done()
        lost.cancel()
        return host.servers["b"].got, fault.seen, (first, third, other)

    got, seen, replies = asyncio.run(main())
    assert [args for _, args in got] == [(0,), (2,), (3,)]
    assert seen == 3 and replies == ((0,), (2,), (3,))


def test_a_matching_hook_counts_only_the_calls_it_matches():
    async def main():
        host, _ = _host()
        fault = host.drop("vote", match=lambda args: args[0] == "big", skip=1, times=None)
        a = host.of("a")
        calls = [
            asyncio.ensure_future(a.call_peer(B, "vote", [k]))
            for k in ["w", "big", "big", "w", "big"]
        ]
        await asyncio.sleep(0.01)
        done = [c.done() for c in calls]
        for c in calls:
            c.cancel()
        return done, fault.seen

    done, seen = asyncio.run(main())
    assert done == [True, True, False, True, False] and seen == 3


def test_a_held_call_arrives_once_released_and_a_delayed_one_after_its_time():
    async def main():
        host, _ = _host()
        held = host.delay("replicate", caller="a")
        call = asyncio.ensure_future(host.of("a").call_peer(B, "replicate", [("entry",)]))
        await asyncio.sleep(0.02)
        before = list(host.servers["b"].got)
        held.release()
        reply = await asyncio.wait_for(call, 1.0)
        host.delay("vote", seconds=0.05)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await host.of("a").call_peer(C, "vote", [1])
        return before, reply, loop.time() - start

    before, reply, waited = asyncio.run(main())
    assert before == [] and reply == ("entry",) and waited >= 0.05


@pytest.mark.parametrize("when", ["before", "sent", "answered"])
def test_a_replica_that_dies_at_a_call_reaches_nobody_and_nobody_reaches_it(when):
    async def main():
        host, deaths = _host()
        host.die("a", "vote", when)
        a = host.of("a")
        try:
            reply = await a.call_peer(B, "vote", [1])
        except OSError:
            reply = None
        with pytest.raises(OSError, match="a is dead"):
            a.call_peer(C, "vote", [2])
        with pytest.raises(OSError, match="a is dead"):
            host.of("b").call_peer(Peer("in-process", "a"), "vote", [3])
        return reply, host.servers["b"].got, deaths

    reply, got, deaths = asyncio.run(main())
    assert deaths == ["a"]
    if when == "before":  # the call never left
        assert reply is None and got == []
    else:
        assert reply == (1,) and got == [("vote", (1,))]


def test_a_replicate_call_hands_over_a_copy():
    async def main():
        host, _ = _host()
        entry = (0, b"blob", [bytearray(b"big")])
        await host.of("a").call_peer(B, "replicate", [entry])
        return entry, host.servers["b"].got[0][1][0]

    sent, got = asyncio.run(main())
    assert got == sent and got[2][0] is not sent[2][0]
