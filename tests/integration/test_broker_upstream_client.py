"""The broker's upstream HTTP/1.1 client against a real loopback server: body framings, reuse, typed errors."""

from __future__ import annotations

import asyncio
import socket

import pytest

from swarmyard.broker.providers.upstream import Timeouts, UpstreamClient
from swarmyard.errors import ProviderError, UpstreamLostError

_ANSWERS = {
    b"/length": b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
    b"/chunked": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    b"6\r\ndata: \r\n5;ext=1\r\nhello\r\n1\r\n\n\r\n0\r\nx-trailer: 1\r\n\r\n",
    b"/continue": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
    b"/closing": b"HTTP/1.1 200 OK\r\n\r\nuntil the end",
    b"/short": b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\ncut",
    b"/drop": b"",
    b"/badlength": b"HTTP/1.1 200 OK\r\ncontent-length: many\r\n\r\n{}",
}


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: list[bytes]) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            seen.append(head + await reader.readexactly(length))
            path = head.split(b" ")[1].removeprefix(b"/base")
            answer = _ANSWERS[path]
            writer.write(answer)
            await writer.drain()
            if path in (b"/closing", b"/short", b"/drop", b"/badlength"):
                return
    except (asyncio.IncompleteReadError, ConnectionError):
        return
    finally:
        writer.close()


def _run(check: object) -> list[bytes]:
    seen: list[bytes] = []

    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: _serve(r, w, seen), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = UpstreamClient(f"http://127.0.0.1:{port}/base", {"authorization": "Bearer k"},
                                Timeouts(connect_s=2, read_s=2, write_s=2), name="test")
        try:
            await check(client)  # type: ignore[operator]
        finally:
            await client.aclose()
            server.close()

    asyncio.run(main())
    return seen


def test_framings_reuse_and_headers() -> None:
    async def check(client: UpstreamClient) -> None:
        response = await client.post("/length", b'{"a":1}')
        assert (response.status, await response.read()) == (200, b"hello")
        response = await client.post("/chunked", b"{}")
        assert [line async for line in response.lines()] == ["data: hello"]
        response = await client.post("/continue", b"{}")
        assert (response.status, await response.read()) == (201, b"ok")
        response = await client.post("/closing", b"{}")
        assert await response.read() == b"until the end"
        # the server closed that connection; the next call opens a fresh one
        response = await client.post("/length", b"{}")
        assert await response.read() == b"hello"

    seen = _run(check)
    assert len(seen) == 5
    first = seen[0].decode()
    assert first.startswith("POST /base/length HTTP/1.1\r\n")
    assert "authorization: Bearer k\r\n" in first and "content-length: 7\r\n" in first
    assert first.endswith('{"a":1}')


def test_a_lost_answer_is_upstream_lost() -> None:
    async def check(client: UpstreamClient) -> None:
        with pytest.raises(UpstreamLostError):
            await client.post("/drop", b"{}")
        response = await client.post("/short", b"{}")
        with pytest.raises(UpstreamLostError):
            await response.read()

    _run(check)


def test_nothing_listening_is_a_retryable_provider_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connections are refused

        async def main() -> None:
            client = UpstreamClient(f"http://127.0.0.1:{port}", {}, Timeouts(connect_s=2), name="test")
            with pytest.raises(ProviderError) as caught:
                await client.post("/x", b"{}")
            assert caught.value.retryable and not isinstance(caught.value, UpstreamLostError)

        asyncio.run(main())


def test_an_unreadable_head_is_lost_and_frees_its_connection() -> None:
    seen: list[bytes] = []

    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: _serve(r, w, seen), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        # one connection only: a head that leaked its slot would make the second call wait for ever
        client = UpstreamClient(f"http://127.0.0.1:{port}", {}, Timeouts(connect_s=2, read_s=2), name="test",
                                max_connections=1)
        try:
            for _ in range(2):
                with pytest.raises(UpstreamLostError, match="content-length"):
                    await client.post("/badlength", b"{}")
            response = await client.post("/length", b"{}")
            assert await response.read() == b"hello"
        finally:
            await client.aclose()
            server.close()

    asyncio.run(main())
    assert len(seen) == 3
