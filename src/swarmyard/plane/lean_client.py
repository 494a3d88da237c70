"""A lean HTTP/1.1 client for the control plane's socket or a machine's loopback relay, standard library and
httptools only.

The built-in agent starts in every machine, and its imports are host CPU paid once per agent: httpx alone
(its models, ``urllib.request``, ``http.cookiejar``, ``email``, ``idna``) is about a quarter of them. The agent
reaches the plane through its machine's relay (plain HTTP/1.1 on loopback) or the plane's Unix socket, posts JSON
and reads JSON back, so it needs none of httpx's generality there: this client posts a JSON body on a
keep-alive connection (written in one ``write``, the answer parsed by httptools) and buffers the whole answer.
Any other URL (TLS, several replicas) keeps httpx (see ``swarmyard.agents.entry``).

What the agent reads of an answer is what :class:`HttpClient` and :class:`HttpResponse` name, which an
``httpx.AsyncClient`` and its ``Response`` also satisfy. Its errors: :class:`ConnectFailed` when nothing was sent
(no connection, or none in time), :class:`AnswerLost` when the request was written and no whole answer came;
:func:`connect_errors` and :func:`http_errors` add httpx's counterparts when httpx is loaded. A request is never
resent: a worker tool call is not idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import httptools

_log = logging.getLogger(__name__)

#: Connections kept open between requests (an agent makes one request at a time).
_MAX_IDLE = 4


class HttpResponse(Protocol):
    """What the agent reads of an answer (an ``httpx.Response`` is one too)."""

    @property
    def status_code(self) -> int: ...

    @property
    def content(self) -> bytes: ...

    @property
    def text(self) -> str: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def json(self) -> Any: ...


class HttpClient(Protocol):
    """What the agent asks of its client: a JSON post on a path of the plane (an ``httpx.AsyncClient`` is one)."""

    async def post(self, url: str, *, json: Any = None) -> HttpResponse: ...


class ClosingHttpClient(HttpClient, Protocol):
    """A client the agent closes at its end."""

    async def aclose(self) -> None: ...


class HttpError(Exception):
    """A request that got no whole answer (``timed_out``: because its time ran out)."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class ConnectFailed(HttpError):
    """Nothing was sent: no connection, or none in time."""


class AnswerLost(HttpError):
    """The request was written (or may have been) and no whole answer came: the connection closed, the answer
    was malformed, or it did not come in time."""


def connect_errors() -> tuple[type[BaseException], ...]:
    """The errors that say nothing was sent, this module's and (when loaded) httpx's."""
    httpx = sys.modules.get("httpx")
    if httpx is None:
        return (ConnectFailed,)
    return ConnectFailed, httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout


def http_errors() -> tuple[type[BaseException], ...]:
    """Every error of a request without a whole answer, this module's and (when loaded) httpx's."""
    httpx = sys.modules.get("httpx")
    return (HttpError,) if httpx is None else (HttpError, httpx.HTTPError)


class Response:
    """A whole answer: its status, headers (names in lower case) and body."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content

    @property
    def text(self) -> str:
        """The body as text (UTF-8, the plane's only charset; undecodable bytes replaced)."""
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON; ``ValueError`` when it is not."""
        return json.loads(self.content)


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self.headers: list[tuple[bytes, bytes]] = []
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
            self._fail(AnswerLost(f"malformed response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(AnswerLost("the server closed the connection before answering"))

    # -- httptools callbacks ------------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

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

    async def roundtrip(self, head: bytes, body: bytes, timeout_s: float | None) -> tuple[int, bytes]:
        """Send one request and wait for its whole answer: its status and body (its headers in ``headers``).
        Raises :class:`AnswerLost` (also when no answer came within ``timeout_s``)."""
        assert self.transport is not None
        self.headers, self._body = [], []
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)
        try:
            async with asyncio.timeout(timeout_s):
                await self._waiter
        except TimeoutError as exc:
            self._fail(AnswerLost("no response in time", timed_out=True))
            raise AnswerLost(f"no response within {timeout_s} s", timed_out=True) from exc
        finally:
            self._waiter = None
        return self._parser.get_status_code(), b"".join(self._body)

    def close(self) -> None:
        """Close the connection."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()


Opener = Callable[[asyncio.AbstractEventLoop], Awaitable[tuple[asyncio.BaseTransport, Connection]]]


def unix_opener(path: str) -> Opener:
    """Connections to the Unix socket at ``path``."""
    return lambda loop: loop.create_unix_connection(Connection, path)


def tcp_opener(host: str, port: int) -> Opener:
    """Connections to ``host:port`` over TCP (the machine's loopback relay)."""
    return lambda loop: loop.create_connection(Connection, host, port)


class Connections:
    """Keep-alive connections to one place (``where`` names it in errors), opened as needed."""

    def __init__(self, opener: Opener, where: str, *, max_idle: int = _MAX_IDLE) -> None:
        self._opener = opener
        self.where = where
        self._max_idle = max_idle
        self._idle: list[Connection] = []

    async def _connect(self, timeout_s: float | None) -> Connection:
        try:
            async with asyncio.timeout(timeout_s):
                _, conn = await self._opener(asyncio.get_running_loop())
        except TimeoutError as exc:
            raise ConnectFailed(f"no connection to {self.where} within {timeout_s} s", timed_out=True) from exc
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {self.where}: {exc}") from exc
        return conn

    async def exchange(self, head: bytes, body: bytes, *, connect_s: float | None,
                       read_s: float | None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """Send one request on an idle connection (or a new one): the answer's status, headers and body."""
        conn = None
        while self._idle:
            candidate = self._idle.pop()
            if not candidate.closed:
                conn = candidate
                break
        if conn is None:
            conn = await self._connect(connect_s)
        try:
            status, content = await conn.roundtrip(head, body, read_s)
        except BaseException:
            conn.close()
            raise
        headers = conn.headers
        if conn.keep_alive and not conn.closed and len(self._idle) < self._max_idle:
            self._idle.append(conn)
        else:
            conn.close()
        return status, headers, content

    def close(self) -> None:
        """Close every idle connection."""
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.close()


class LeanClient:
    """JSON posts to the plane on ``connections``, with fixed ``headers`` (an ``Authorization``) and one timeout
    for connecting and for each answer. ``host`` is the ``Host`` header sent."""

    def __init__(self, connections: Connections, *, host: str, headers: Mapping[str, str],
                 timeout_s: float) -> None:
        self._connections = connections
        self._timeout_s = timeout_s
        fixed = {"Host": host, "Accept": "*/*", "Connection": "keep-alive", "User-Agent": "swarmyard-agent",
                 **headers}
        self._fixed = b"".join(f"{name}: {value}\r\n".encode("latin-1") for name, value in fixed.items())

    async def post(self, url: str, *, json: Any = None) -> Response:
        """``POST url`` (a path) with ``json`` as its body, encoded as httpx encodes it (compact, UTF-8, no
        NaN: ``ValueError``)."""
        body = _dumps(json).encode("utf-8")
        head = (b"POST " + url.encode("ascii") + b" HTTP/1.1\r\n" + self._fixed
                + b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        status, raw, content = await self._connections.exchange(head, body, connect_s=self._timeout_s,
                                                                read_s=self._timeout_s)
        headers: dict[str, str] = {}
        for name, value in raw:
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        # the line httpx logs for each request, so an agent's log reads the same over either client
        _log.info('HTTP Request: POST %s "HTTP/1.1 %d"', url, status)
        return Response(status, headers, content)

    async def aclose(self) -> None:
        """Close the client's connections."""
        self._connections.close()

    async def __aenter__(self) -> LeanClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
