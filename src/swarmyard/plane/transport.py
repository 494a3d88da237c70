"""A lean httpx transport for HTTP/1.1 over a Unix socket (the control plane's socket), or loopback TCP.

httpx's default stack (httpcore, anyio streams, h11 in pure Python, a cancel scope per read) costs about a
millisecond of CPU per request, more than the control plane spends answering it; a process that holds
hundreds of workers' clients (the bench, a relay for many agents) would be measuring httpx. This transport
keeps httpx's client API (``AsyncClient``, ``Response``, its errors) and replaces only the wire: an asyncio
protocol per keep-alive connection, requests written in one ``write``, responses parsed by httptools (the C
parser uvicorn uses on the server side). It buffers whole responses: the plane's answers are small JSON.

Errors are httpx's own: ``ConnectError`` (no server), ``RemoteProtocolError`` (connection lost or a bad
response), ``ReadTimeout``. A request is never resent: a worker tool call is not idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any

import httptools
import httpx


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self.keep_alive = True

    # -- asyncio.Protocol ---------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, so no isinstance check here.
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"malformed response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(httpx.RemoteProtocolError("the server closed the connection before answering"))

    # -- httptools callbacks ------------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.keep_alive = self._parser.should_keep_alive()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- use ----------------------------------------------------------------------------------------------
    def _fail(self, exc: Exception) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    async def roundtrip(self, head: bytes, body: bytes, timeout_s: float | None) -> httpx.Response:
        """Send one request and wait for its whole response."""
        assert self.transport is not None
        self._headers, self._body = [], []
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)
        try:
            async with asyncio.timeout(timeout_s):
                await self._waiter
        except TimeoutError as exc:
            self._fail(httpx.ReadTimeout("no response in time"))
            raise httpx.ReadTimeout(f"no response within {timeout_s} s") from exc
        finally:
            self._waiter = None
        return httpx.Response(self._parser.get_status_code(), headers=self._headers,
                              content=b"".join(self._body))

    def close(self) -> None:
        """Close the connection."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class UnixSocketTransport(httpx.AsyncBaseTransport):
    """``httpx.AsyncClient(transport=UnixSocketTransport(path), base_url="http://plane")``."""

    def __init__(self, path: str, *, max_idle: int = 16) -> None:
        self._path = path
        self._max_idle = max_idle
        self._idle: list[_Connection] = []

    def _open(self, loop: asyncio.AbstractEventLoop) -> Awaitable[tuple[asyncio.BaseTransport, _Connection]]:
        return loop.create_unix_connection(_Connection, self._path)

    async def _connect(self, timeout_s: float | None) -> _Connection:
        try:
            async with asyncio.timeout(timeout_s):
                _, conn = await self._open(asyncio.get_running_loop())
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"no connection to {self._path} within {timeout_s} s") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {self._path}: {exc}") from exc
        return conn

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` on an idle connection (or a new one) and return the buffered response."""
        timeouts: dict[str, Any] = request.extensions.get("timeout", {})
        body = await request.aread()
        head = _head(request, len(body))
        conn = None
        while self._idle:
            candidate = self._idle.pop()
            if not candidate.closed:
                conn = candidate
                break
        if conn is None:
            conn = await self._connect(timeouts.get("connect"))
        try:
            response = await conn.roundtrip(head, body, timeouts.get("read"))
        except BaseException:
            conn.close()
            raise
        if conn.keep_alive and not conn.closed and len(self._idle) < self._max_idle:
            self._idle.append(conn)
        else:
            conn.close()
        return response

    async def aclose(self) -> None:
        """Close every idle connection."""
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.close()


class LoopbackTcpTransport(UnixSocketTransport):
    """The same lean transport over TCP to ``host:port`` (a benchmark's loopback upstream, called directly)."""

    def __init__(self, host: str, port: int, *, max_idle: int = 16) -> None:
        super().__init__(f"{host}:{port}", max_idle=max_idle)
        self._host, self._port = host, port

    def _open(self, loop: asyncio.AbstractEventLoop) -> Awaitable[tuple[asyncio.BaseTransport, _Connection]]:
        return loop.create_connection(_Connection, self._host, self._port)


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
