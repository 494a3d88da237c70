"""A lean httpx transport for HTTP/1.1 over a Unix socket (the control plane's socket), or loopback TCP.

httpx's default stack (httpcore, anyio streams, h11 in pure Python, a cancel scope per read) costs about a
millisecond of CPU per request, more than the control plane spends answering it; a process that holds
hundreds of workers' clients (the bench, a relay for many agents) would be measuring httpx. This transport
keeps httpx's client API (``AsyncClient``, ``Response``, its errors) and replaces only the wire: an asyncio
protocol per keep-alive connection, requests written in one ``write``, responses parsed by httptools (the C
parser uvicorn uses on the server side; the connections are :mod:`swarmyard.plane.lean_client`'s, which the
built-in agent uses without httpx). It buffers whole responses: the plane's answers are small JSON.

Errors are httpx's own: ``ConnectError`` (no server), ``RemoteProtocolError`` (connection lost or a bad
response), ``ReadTimeout``. A request is never resent: a worker tool call is not idempotent.
"""

from __future__ import annotations

from typing import Any

import httpx

from swarmyard.plane.lean_client import (
    AnswerLost,
    ConnectFailed,
    Connections,
    Opener,
    tcp_opener,
    unix_opener,
)


class UnixSocketTransport(httpx.AsyncBaseTransport):
    """``httpx.AsyncClient(transport=UnixSocketTransport(path), base_url="http://plane")``."""

    def __init__(self, path: str, *, max_idle: int = 16) -> None:
        self._connections = Connections(self._opener(path), path, max_idle=max_idle)

    def _opener(self, path: str) -> Opener:
        return unix_opener(path)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` on an idle connection (or a new one) and return the buffered response."""
        timeouts: dict[str, Any] = request.extensions.get("timeout", {})
        body = await request.aread()
        try:
            status, headers, content = await self._connections.exchange(
                _head(request, len(body)), body, connect_s=timeouts.get("connect"), read_s=timeouts.get("read"))
        except ConnectFailed as exc:
            raise (httpx.ConnectTimeout if exc.timed_out else httpx.ConnectError)(str(exc)) from exc
        except AnswerLost as exc:
            raise (httpx.ReadTimeout if exc.timed_out else httpx.RemoteProtocolError)(str(exc)) from exc
        return httpx.Response(status, headers=headers, content=content)

    async def aclose(self) -> None:
        """Close every idle connection."""
        self._connections.close()


class LoopbackTcpTransport(UnixSocketTransport):
    """The same lean transport over TCP to ``host:port`` (a benchmark's loopback upstream, called directly)."""

    def __init__(self, host: str, port: int, *, max_idle: int = 16) -> None:
        self._host, self._port = host, port
        super().__init__(f"{host}:{port}", max_idle=max_idle)

    def _opener(self, path: str) -> Opener:
        return tcp_opener(self._host, self._port)


def _head(request: httpx.Request, length: int) -> bytes:
    target = request.url.raw_path
    lines = [request.method.encode() + b" " + target + b" HTTP/1.1"]
    has_length = False
    for name, value in request.headers.raw:
        lower = name.lower()
        if lower == b"transfer-encoding":
            continue  # the body is sent whole, with its length
        if lower == b"content-length":
            has_length = True
            value = str(length).encode()
        lines.append(name + b": " + value)
    if not has_length and (length or request.method not in ("GET", "HEAD")):
        lines.append(b"Content-Length: " + str(length).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n"
