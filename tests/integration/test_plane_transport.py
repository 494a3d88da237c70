"""The lean Unix-socket httpx transport against a real uvicorn server: keep-alive, errors, large bodies."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from swarmyard.plane.server import BackgroundServer, Listen
from swarmyard.plane.transport import UnixSocketTransport


async def _echo(request: Request) -> Response:
    body = await request.body()
    return Response(body, media_type="application/octet-stream",
                    headers={"x-method": request.method, "x-query": request.url.query})


async def _close(request: Request) -> Response:
    return Response(b"bye", headers={"connection": "close"})


@pytest.fixture
def sock(short_tmp: Path) -> Iterator[Path]:
    listen = Listen(socket_path=short_tmp / "t.sock")  # short: Unix socket paths are limited to 108 bytes
    app = Starlette(routes=[Route("/echo", _echo, methods=["GET", "POST", "PUT"]), Route("/close", _close)])
    with BackgroundServer(app, listen):
        yield short_tmp / "t.sock"


def test_round_trips_reuse_one_connection(sock: Path) -> None:
    async def go() -> None:
        transport = UnixSocketTransport(str(sock))
        async with httpx.AsyncClient(transport=transport, base_url="http://plane") as http:
            big = bytes(range(256)) * 2048  # 512 KiB: more than one write and several reads
            for i in range(5):
                r = await http.post("/echo", params={"i": i}, content=big)
                assert r.status_code == 200 and r.content == big
                assert r.headers["x-query"] == f"i={i}"
            r = await http.get("/echo")
            assert r.headers["x-method"] == "GET" and r.content == b""
            assert len(transport._connections._idle) == 1  # every request went over the same kept-alive connection
            # a server that closes after answering: the answer arrives, the connection is not reused
            r = await http.get("/close")
            assert r.text == "bye" and transport._connections._idle == []

    asyncio.run(go())


def test_missing_socket_is_a_connect_error(tmp_path: Path) -> None:
    async def go() -> None:
        async with httpx.AsyncClient(transport=UnixSocketTransport(str(tmp_path / "none.sock")),
                                     base_url="http://plane") as http:
            with pytest.raises(httpx.ConnectError):
                await http.get("/echo")

    asyncio.run(go())
