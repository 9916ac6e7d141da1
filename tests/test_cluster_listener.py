"""The replication listener (``labkv.cluster._transport.channel``) against strangers: a
flood of connections that never send the token, under a low descriptor limit,
is closed by the token deadline and leaves the listener serving, with one log
line; an oversized frame is closed unread."""

from __future__ import annotations

import asyncio
import resource
import subprocess
import sys
import textwrap

import pytest

from labkv.cluster._transport import channel as _channel

LISTENER = textwrap.dedent(
    """
    import asyncio, resource, sys, types
    from labkv.cluster._transport import channel as _channel

    resource.setrlimit(resource.RLIMIT_NOFILE, (160, 160))
    _channel.TOKEN_TIMEOUT_S = float(sys.argv[1])
    worker = types.SimpleNamespace(
        address="tcp://127.0.0.1:1", security=None, state=types.SimpleNamespace(actors={})
    )

    async def main():
        listener = _channel._Listener(worker)
        host, port, token = await listener.address()
        print(port, token.hex(), flush=True)
        while True:
            await asyncio.sleep(0.5)
            print("refused", listener.refused, "waiting", listener.unauthenticated, flush=True)

    asyncio.run(main())
    """
)


async def _call_unknown_actor(port: int, token: bytes) -> bytes:
    """One authenticated call to an actor that is not there: the failure reply."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
    key, blob = b"labkv-server-nowhere", b"x"
    writer.write(token + _channel._CALL.pack(7, 0, len(key), len(blob)) + key + blob)
    call_id, status, length = _channel._REPLY.unpack(await reader.readexactly(_channel._REPLY.size))
    message = await reader.readexactly(length)
    writer.close()
    assert (call_id, status) == (7, _channel._FAILED)
    return message


async def _flood(port: int, n: int) -> list:
    async def one():
        try:
            return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
        except (OSError, asyncio.TimeoutError):
            return None

    return [c for c in await asyncio.gather(*(one() for _ in range(n))) if c is not None]


@pytest.mark.slow
@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 1200, reason="low fd limit")
def test_a_flood_without_the_token_leaves_the_listener_serving_and_quiet():
    listener = subprocess.Popen(
        [sys.executable, "-c", LISTENER, "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port, token = listener.stdout.readline().split()
        port, token = int(port), bytes.fromhex(token)

        async def attack():
            held = await _flood(port, 1000)  # more than the listener's 160 descriptors
            # The strangers hold every waiting slot until the token deadline (a new
            # channel meanwhile goes as an actor call); after it, the listener serves.
            await asyncio.sleep(3)
            served = await _call_unknown_actor(port, token)
            for _, writer in held:
                writer.close()
            return len(held), served

        try:
            opened, served = asyncio.run(attack())
        except Exception:
            listener.kill()
            print(listener.communicate(timeout=30)[1][-3000:])
            raise
        assert opened > 160  # the flood reached past the descriptor limit
        assert b"no server labkv-server-nowhere" in served
        line = ""
        for _ in range(20):
            line = listener.stdout.readline()
            if line.startswith("refused") and line.split()[-1] == "0":
                break
        assert line.split()[-1] == "0", line  # no connection waits for its token any more
        assert int(line.split()[1]) > 160  # strangers refused, more than it has descriptors
    finally:
        listener.kill()
        _, stderr = listener.communicate(timeout=30)
    assert stderr.count("Traceback") == 0 and len(stderr.splitlines()) <= 5, stderr[-2000:]


def test_an_oversized_frame_is_closed_unread():
    listener = subprocess.Popen(
        [sys.executable, "-c", LISTENER, "5"], stdout=subprocess.PIPE, text=True
    )
    try:
        port, token = listener.stdout.readline().split()
        port, token = int(port), bytes.fromhex(token)

        async def send_huge():
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            huge = _channel.MAX_BLOB_BYTES + 1
            writer.write(bytes.fromhex(token.hex()) + _channel._CALL.pack(1, 0, 4, huge) + b"key!")
            got = await asyncio.wait_for(reader.read(), 10)  # closed: b"", no reply
            writer.close()
            return got

        assert asyncio.run(send_huge()) == b""
    finally:
        listener.kill()
        listener.communicate(timeout=30)
