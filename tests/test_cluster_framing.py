"""The stream's socket frames on a real Dask TCP comm pair (no cluster): whole
messages of every size, sends from many threads at once, and both ways a
connection ends."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from distributed.comm import connect, listen

from labkv.cluster._transport import framing
from labkv.cluster._transport.stream import READY


class _Inbox:
    """What one end received: messages in order, and how it ended."""

    def __init__(self) -> None:
        self.messages: list[tuple[int, int, object]] = []
        self.ended: BaseException | None = None
        self.arrived = asyncio.Event()

    def deliver(self, seq: int, kind: int, value: object) -> None:
        self.messages.append((seq, kind, value))
        self.arrived.set()

    def closed(self, error: BaseException) -> None:
        self.ended = error
        self.arrived.set()

    async def until(self, predicate, timeout: float = 20.0) -> None:
        async def wait() -> None:
            while not predicate():
                self.arrived.clear()
                await self.arrived.wait()

        await asyncio.wait_for(wait(), timeout)


def _security(folder) -> dict:
    """Dask's listen and connection arguments of a TLS comm with mutual
    certificates (made in ``folder``)."""
    from distributed import Security

    from tests.test_cluster_cli import _make_certs

    _make_certs(folder)
    ca, cert, key = (str(folder / n) for n in ("ca.pem", "node.pem", "node.key"))
    security = Security(
        tls_ca_file=ca,
        tls_client_cert=cert,
        tls_client_key=key,
        tls_worker_cert=cert,
        tls_worker_key=key,
        require_encryption=True,
    )
    return {
        "listen": security.get_listen_args("worker"),
        "connect": security.get_connection_args("client"),
    }


async def _socket_pair(tls: dict | None = None):
    """Two ``SocketFrames`` ends of one Dask TCP comm (``tls``: a TLS comm with
    these arguments), after the same hello and answer as a stream's, and their inboxes."""
    accepted: asyncio.Future = asyncio.get_running_loop().create_future()
    keep = asyncio.get_running_loop().create_future()

    async def handle(comm) -> None:
        await comm.read()  # the hello
        await comm.write(READY)
        accepted.set_result(comm)
        await keep

    scheme = "tls" if tls else "tcp"
    listener = listen(f"{scheme}://127.0.0.1:0", handle, **(tls or {}).get("listen", {}))
    await listener.start()
    caller = await connect(listener.contact_address, **(tls or {}).get("connect", {}))
    await caller.write({"op": "hello"})
    assert await caller.read() == READY
    ends = [framing.wire(caller, "socket"), framing.wire(await accepted, "socket")]
    assert [end.tls for end in ends] == [bool(tls)] * 2 and type(ends[0]).__name__ == "SocketFrames"
    inboxes = [_Inbox(), _Inbox()]
    for end, inbox in zip(ends, inboxes, strict=True):
        end.start(inbox.deliver, inbox.closed, None)
    return ends, inboxes, listener, keep


def _run(test) -> None:
    asyncio.run(asyncio.wait_for(test(), 60))


@pytest.mark.parametrize("comm", ["tcp", "tls"])
def test_messages_of_every_size_arrive_whole_and_in_order(comm, tmp_path):
    big = np.arange(4 << 20, dtype=np.float32)  # 16 MiB: many partial writes and reads
    many = [np.full(3, i, np.int64) for i in range(1500)]  # more buffers than one sendmsg
    values = [None, 7, "x" * 100_000, big, many, {"k": big[:10], "s": (1, 2)}, b""]
    tls = _security(tmp_path) if comm == "tls" else None

    async def test() -> None:
        (a, b), (_, inbox), listener, keep = await _socket_pair(tls)
        for seq, value in enumerate(values):
            a.send(seq, 1, value)
        await inbox.until(lambda: len(inbox.messages) == len(values))
        assert [m[0] for m in inbox.messages] == list(range(len(values)))
        got = [m[2] for m in inbox.messages]
        assert got[:3] == values[:3] and got[6] == b""
        np.testing.assert_array_equal(got[3], big)
        assert len(got[4]) == 1500
        for i, array in enumerate(got[4]):
            np.testing.assert_array_equal(array, many[i])
        np.testing.assert_array_equal(got[5]["k"], big[:10])
        assert got[5]["s"] == (1, 2) and inbox.ended is None
        keep.set_result(None)
        listener.stop()

    _run(test)


@pytest.mark.parametrize("comm", ["tcp", "tls"])
def test_sends_from_many_threads_each_arrive_once_in_each_threads_order(comm, tmp_path):
    tls = _security(tmp_path) if comm == "tls" else None

    async def test() -> None:
        (a, b), (_, inbox), listener, keep = await _socket_pair(tls)
        b.send(0, 9, np.ones(1 << 20, np.uint8))  # read by a while the threads write
        threads, per_thread = 4, 300

        def sender(t: int) -> None:
            for i in range(per_thread):
                payload = np.full(1 + (i % 5) * 2000, t * 1000 + i, np.int32)
                a.send(t * per_thread + i, t, payload)

        workers = [threading.Thread(target=sender, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        await asyncio.get_running_loop().run_in_executor(None, lambda: [w.join() for w in workers])
        await inbox.until(lambda: len(inbox.messages) == threads * per_thread)
        seqs = [m[0] for m in inbox.messages]
        assert sorted(seqs) == list(range(threads * per_thread))
        for t in range(threads):
            mine = [(seq, value) for seq, kind, value in inbox.messages if kind == t]
            assert [seq for seq, _ in mine] == [t * per_thread + i for i in range(per_thread)]
            assert all(int(v[0]) == t * 1000 + (s - t * per_thread) for s, v in mine)
        keep.set_result(None)
        listener.stop()

    _run(test)


@pytest.mark.parametrize("comm", ["tcp", "tls"])
@pytest.mark.parametrize("how", ["the other end closes", "dask aborts the comm"])
def test_an_ended_connection_is_told_once_and_refuses_sends(how, comm, tmp_path):
    tls = _security(tmp_path) if comm == "tls" else None

    async def test() -> None:
        (a, b), (inbox_a, inbox_b), listener, keep = await _socket_pair(tls)
        a.send(0, 1, "before")
        await inbox_b.until(lambda: inbox_b.messages)
        if how == "the other end closes":
            b.abort()
        else:
            b.comm.abort()  # as a closing worker aborts its comms
        await inbox_a.until(lambda: inbox_a.ended is not None)
        await inbox_b.until(lambda: inbox_b.ended is not None)
        assert isinstance(inbox_a.ended, OSError) and isinstance(inbox_b.ended, OSError)
        assert a.comm.closed() and b.comm.closed()
        for end in (a, b):
            with pytest.raises(OSError, match="closed"):
                end.send(1, 1, "after")
        keep.set_result(None)
        listener.stop()

    _run(test)


@pytest.mark.parametrize(
    ("setting", "framed"), [("frames", "socket"), ("messages", "messages"), ("iostream", None)]
)
def test_the_framing_setting_chooses_a_tcp_comms_wire_and_a_retired_one_is_refused(setting, framed):
    # 'iostream' (the frames through tornado's IOStream) left the product: asking for
    # it names the two that remain instead of quietly framing some other way.
    import dask

    async def test() -> None:
        listener = listen("tcp://127.0.0.1:0", lambda comm: comm.close())
        await listener.start()
        caller = await connect(listener.contact_address)
        try:
            with dask.config.set({"labkv.stream-framing": setting}):
                if framed is None:
                    with pytest.raises(ValueError, match="'frames' or 'messages'"):
                        framing.framing_of(caller)
                else:
                    assert framing.framing_of(caller) == framed
        finally:
            caller.abort()
            listener.stop()

    _run(test)


def test_a_hello_asking_for_an_unknown_framing_is_refused():
    with pytest.raises(ValueError, match="'socket' or 'messages'"):
        framing.wire(object(), "frames")
