"""A lean HTTP/1.1 client for the upstream providers: keep-alive pool, timeouts, streamed bodies, typed errors.

Why not httpx: on the broker's hot path httpx's layers (auth, redirects, anyio streams, h11 events) cost about
1 ms of CPU per call, more than the whole budget the broker may add (0.5 ms). This client does only what an
upstream model API needs: ``POST`` a JSON body, read a status, headers and a body framed by Content-Length,
chunked transfer coding or connection close, over plain TCP or TLS, on asyncio streams directly (the broker's
server runs on asyncio; asyncio sets ``TCP_NODELAY`` on every TCP connection it opens).

Errors are already the broker's: a failure before any request byte was written is ``ProviderError``
(retryable: nothing can have been billed); any failure after is ``UpstreamLostError`` (the cost is unknown).
A connection goes back to the pool only after its response was read whole; anything else closes it.
Not supported: proxies from the environment, compressed bodies (the client asks for identity), HTTP/2.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from swarmyard.errors import ProviderError, UpstreamLostError

_HEAD_LIMIT = 1 << 20  # the most header bytes an upstream may send
_READ_SIZE = 1 << 16
#: The most body bytes one response may carry (a whole answer, a whole stream): past it the answer is lost.
BODY_LIMIT_BYTES = 32 << 20
_LINE_LIMIT_BYTES = 4 << 20  # the longest line ``lines`` joins (an SSE event)
_CHUNK_SIZE = re.compile(rb"[0-9a-fA-F]{1,16}")


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Upstream timeouts in seconds; ``read_s`` bounds each wait for bytes, ``connect_s`` a connection (and a
    wait for a free one), ``write_s`` sending the request."""

    connect_s: float = 5.0
    read_s: float = 120.0
    write_s: float = 30.0


class _Connection:
    """One kept-alive TCP (or TLS) connection."""

    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def reusable(self) -> bool:
        # an idle connection the server closed has its EOF already fed to the reader
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.transport.abort()


class UpstreamResponse:
    """A response whose status and headers were read; the body is read with ``read`` or ``lines``."""

    def __init__(
        self, client: UpstreamClient, conn: _Connection, status: int, headers: dict[str, str], version: str
    ) -> None:
        self.status = status
        self.headers = headers
        self._client = client
        self._conn: _Connection | None = conn
        self._name = client.name
        self._timeout_s = client.timeouts.read_s
        encoding = headers.get("transfer-encoding", "").lower()
        self._chunked = "chunked" in encoding
        length = headers.get("content-length")
        self._remaining: int | None = None
        if status in (204, 304):
            self._remaining = 0
        elif not self._chunked and length is not None:
            if not length.strip().isdigit():
                raise UpstreamLostError(f"{self._name}: upstream sent a bad content-length")
            self._remaining = int(length)
        # a body framed by the connection's close, or a server that says it will close, ends the connection's
        # use: HTTP/1.1 closes only on "Connection: close", HTTP/1.0 unless it says "keep-alive" (RFC 9112 9.3);
        # a connection put back that the server then closes fails the next call after its request left
        tokens = {t.strip() for t in headers.get("connection", "").lower().split(",")}
        persistent = "keep-alive" in tokens if version == "HTTP/1.0" else "close" not in tokens
        self._keep = (self._chunked or self._remaining is not None) and persistent
        self._done = False

    async def _read(self, pending: Awaitable[bytes]) -> bytes:
        try:
            async with asyncio.timeout(self._timeout_s):
                data = await pending
        except TimeoutError as exc:
            raise UpstreamLostError(f"{self._name}: upstream read timed out") from exc
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, OSError) as exc:
            raise UpstreamLostError(
                f"{self._name}: upstream connection lost while reading ({type(exc).__name__})"
            ) from exc
        return data

    def _too_long(self) -> UpstreamLostError:
        return UpstreamLostError(f"{self._name}: upstream body is longer than {BODY_LIMIT_BYTES} bytes")

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive, never more than ``BODY_LIMIT_BYTES`` of them (nor buffered more
        than ``_READ_SIZE`` at a time, whatever size a chunk claims): past it the answer is lost."""
        conn = self._conn
        if conn is None or self._done:
            return
        reader = conn.reader
        left = BODY_LIMIT_BYTES
        try:
            if self._chunked:
                while True:
                    line = await self._read(reader.readuntil(b"\r\n"))
                    size_text = line.split(b";", 1)[0].strip()
                    if not _CHUNK_SIZE.fullmatch(size_text):
                        raise UpstreamLostError(f"{self._name}: upstream sent a bad chunk size")
                    size = int(size_text, 16)
                    if size > left:
                        raise self._too_long()
                    left -= size
                    if size == 0:
                        # trailers, if any, end with an empty line
                        while (await self._read(reader.readuntil(b"\r\n"))) != b"\r\n":
                            pass
                        break
                    if size <= _READ_SIZE:
                        data = await self._read(reader.readexactly(size + 2))
                        yield data[:-2]
                        continue
                    while size > 0:  # a long chunk in pieces, as it arrives
                        data = await self._read(reader.read(min(size, _READ_SIZE)))
                        if not data:
                            raise UpstreamLostError(f"{self._name}: upstream closed inside a chunk")
                        size -= len(data)
                        yield data
                    if await self._read(reader.readexactly(2)) != b"\r\n":
                        raise UpstreamLostError(f"{self._name}: upstream sent a chunk longer than its size")
            elif self._remaining is not None:
                # counted as read, not refused by its length: an error body's first bytes are still read
                while self._remaining > 0:
                    if left <= 0:
                        raise self._too_long()
                    data = await self._read(reader.read(min(self._remaining, left, _READ_SIZE)))
                    if not data:
                        raise UpstreamLostError(f"{self._name}: upstream closed before the body's end")
                    self._remaining -= len(data)
                    left -= len(data)
                    yield data
            else:
                while data := await self._read(reader.read(_READ_SIZE)):
                    left -= len(data)
                    if left < 0:
                        raise self._too_long()
                    yield data
            self._done = True
        finally:
            self._finish()

    async def read(self) -> bytes:
        """The whole body."""
        return b"".join([chunk async for chunk in self.chunks()])

    async def lines(self) -> AsyncIterator[str]:
        """The body as text lines (``\\n`` or ``\\r\\n`` ended), as they arrive; for server-sent events. A line
        longer than ``_LINE_LIMIT_BYTES`` is a lost answer (joined once, when its end comes, not per chunk)."""
        parts: list[bytes] = []
        size = 0
        async for chunk in self.chunks():
            if b"\n" not in chunk:
                parts.append(chunk)
                size += len(chunk)
                if size > _LINE_LIMIT_BYTES:
                    raise UpstreamLostError(f"{self._name}: upstream sent a line longer than {_LINE_LIMIT_BYTES} bytes")
                continue
            *complete, rest = b"".join([*parts, chunk]).split(b"\n")
            parts, size = [rest], len(rest)
            for line in complete:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
        pending = b"".join(parts)
        if pending:
            yield pending.rstrip(b"\r").decode("utf-8", "replace")

    def _finish(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._client._give_back(conn, reuse=self._done and self._keep)

    async def aclose(self) -> None:
        """Stop reading; an unread body closes the connection instead of returning it."""
        self._finish()


class UpstreamClient:
    """A pool of HTTP/1.1 connections to one upstream origin, with fixed headers on every request."""

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str],
        timeouts: Timeouts,
        *,
        name: str,
        max_connections: int = 1000,
    ) -> None:
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ProviderError(f"{name}: upstream URL must be http(s)://host[:port][/path]", retryable=False)
        self.name = name
        self.timeouts = timeouts
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._tls: ssl.SSLContext | None = ssl.create_default_context() if parts.scheme == "https" else None
        self._prefix = parts.path
        host_header = parts.netloc.rsplit("@", 1)[-1]
        fixed = {"host": host_header, "accept-encoding": "identity", "user-agent": "swarmyard-broker",
                 **{k.lower(): v for k, v in headers.items()}}
        # the request head minus its first line and length, encoded once
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items()).encode("latin-1")
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._closed = False

    async def _connect(self) -> _Connection:
        if self._closed:
            raise ProviderError(f"{self.name}: the upstream client is closed", retryable=False)
        if self._slots.locked():
            try:
                async with asyncio.timeout(self.timeouts.connect_s):
                    await self._slots.acquire()
            except TimeoutError:
                raise ProviderError(f"{self.name}: no free upstream connection in time", retryable=True) from None
        else:
            await self._slots.acquire()  # a free slot: returns at once
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable():
                return conn
            conn.close()
        try:
            async with asyncio.timeout(self.timeouts.connect_s):
                reader, writer = await asyncio.open_connection(
                    self._host, self._port, ssl=self._tls, limit=_HEAD_LIMIT,
                    server_hostname=self._host if self._tls else None,
                )
        except (TimeoutError, OSError) as exc:
            self._slots.release()
            raise ProviderError(
                f"{self.name}: could not connect upstream ({type(exc).__name__})", retryable=True
            ) from exc
        except BaseException:
            self._slots.release()
            raise
        return _Connection(reader, writer)

    def _give_back(self, conn: _Connection, *, reuse: bool) -> None:
        if reuse and not self._closed and conn.reusable():
            self._idle.append(conn)
        else:
            conn.close()
        self._slots.release()

    async def post(self, path: str, body: bytes) -> UpstreamResponse:
        """Send ``body`` (JSON) to ``path``; return once the status and headers are in.

        Raises ``ProviderError`` if nothing was written, ``UpstreamLostError`` after.
        """
        conn = await self._connect()
        head = (
            f"POST {self._prefix}{path} HTTP/1.1\r\n".encode("latin-1")
            + self._fixed
            + b"content-type: application/json\r\ncontent-length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
        )
        try:
            conn.writer.write(head + body)
            async with asyncio.timeout(self.timeouts.write_s):
                await conn.writer.drain()
            async with asyncio.timeout(self.timeouts.read_s):
                while True:
                    raw = await conn.reader.readuntil(b"\r\n\r\n")
                    version, status, headers = _parse_head(raw)
                    if status >= 200:
                        break  # 1xx interim answers carry nothing for us
            # a head whose framing cannot be read (a bad content-length) is lost here, while the connection
            # still goes back (closed) to the pool
            return UpstreamResponse(self, conn, status, headers, version)
        except TimeoutError as exc:
            self._give_back(conn, reuse=False)
            raise UpstreamLostError(f"{self.name}: upstream timed out after the request was sent") from exc
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, OSError,
                ValueError) as exc:
            self._give_back(conn, reuse=False)
            raise UpstreamLostError(
                f"{self.name}: upstream connection lost after the request was sent ({type(exc).__name__})"
            ) from exc
        except BaseException:
            self._give_back(conn, reuse=False)
            raise

    async def aclose(self) -> None:
        """Close every idle connection; busy ones close when their responses end."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()


def _parse_head(raw: bytes) -> tuple[str, int, dict[str, str]]:
    """Version, status and lower-cased headers of a response head; ``ValueError`` if it is not HTTP/1.x."""
    lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError("not an HTTP/1.x response")
    status = int(rest[:3])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            key = name.strip().lower()
            # repeated headers join with commas (RFC 9110 5.3), which is what matters for transfer-encoding
            headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    return version, status, headers
