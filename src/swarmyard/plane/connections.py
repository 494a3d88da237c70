"""Guards on the connections one listener of the plane holds: a deadline for a request's headers, one for its
body, a cap on the bytes a request's line and headers may take, and a cap on how many connections the listener
keeps open.

uvicorn waits without end for a request line or headers that never finish, and for a body shorter than its
``Content-Length``; a few thousand such connections (no token needed: ``POST /ui/login`` reads its body
first) use up the process's file descriptors, and then the workers' Unix socket refuses them too. Each
listener gets its own cap, a share of the open-files limit, so a flood on TCP leaves the Unix socket room.
The parser keeps a header line whole however long it is (one of 300 MiB was read into memory and answered 200):
past ``max_header_bytes`` before the headers end, the request is answered 431 and the connection closed.
A request whose headers and body have arrived has no deadline: the dashboard's event streams last a run.
"""

from __future__ import annotations

import logging
import resource
import time
from asyncio import AbstractEventLoop, TimerHandle, Transport
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

_LOG_EVERY_S = 10.0  # one line per listener at most this often, however many connections are closed
_RESERVED_FDS = 256  # the store, log files, trajectories, an evaluator's socket: not for listeners


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How long a request may take to send its headers and its body, how many bytes its request line and headers
    may take, and how many connections a listener holds (``None``: an equal share of the open-files limit, less
    what the rest of the process needs)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int | None = None
    max_header_bytes: int = 64 << 10

    def __post_init__(self) -> None:
        if self.header_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise ValueError("the header and body timeouts must be positive")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if self.max_header_bytes < 1024:
            raise ValueError("max_header_bytes must be at least 1024")

    def cap(self, listeners: int) -> int:
        """The connections each of ``listeners`` listeners may hold at once."""
        if self.max_connections is not None:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            soft = 1 << 20
        return max(16, (soft - _RESERVED_FDS) // max(1, listeners))

    def burst(self, cap: int) -> int:
        """How many connections a listener with ``cap`` accepts at once (its backlog): a connection over the cap
        is closed only once the loop comes round to it, so a flood holds the cap and about two bursts at worst."""
        return max(16, cap // 4)


class _Closures:
    """Counts the connections a listener closed, and says so in the log (the first at once, then at most one
    line every ``_LOG_EVERY_S`` with the count since the last; a count left over is said when its time comes)."""

    def __init__(self, where: str) -> None:
        self._where = where
        self._counts: Counter[str] = Counter()
        self._logged_at = -_LOG_EVERY_S
        self._flush: TimerHandle | None = None

    def note(self, why: str, loop: AbstractEventLoop) -> None:
        self._counts[why] += 1
        wait_s = self._logged_at + _LOG_EVERY_S - time.monotonic()
        if wait_s <= 0:
            self._say()
        elif self._flush is None:
            self._flush = loop.call_later(wait_s, self._say)

    def _say(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        self._logged_at = time.monotonic()
        if self._counts:
            said = "; ".join(f"{n} {why}" for why, n in self._counts.items())
            self._counts.clear()
            log.warning("closed connections on %s: %s", self._where, said)


class _GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the deadlines and the cap (set per listener by ``guarded_protocol``)."""

    limits: ClassVar[ConnectionLimits]
    cap: ClassVar[int]
    closures: ClassVar[_Closures]
    _deadline: TimerHandle | None = None
    #: bytes received since the current request began, while its headers have not ended (``None``: they have)
    _head_bytes: int | None = 0

    def connection_made(self, transport: Transport) -> None:  # type: ignore[override]
        over = len(self.connections) >= self.cap
        super().connection_made(transport)
        if over:
            self.closures.note(f"over the cap of {self.cap} open connections", self.loop)
            transport.close()
            return
        self._arm(self.limits.header_timeout_s, "request line and headers")

    def data_received(self, data: bytes) -> None:
        counting = self._head_bytes is not None
        if counting:
            self._head_bytes = (self._head_bytes or 0) + len(data)
        super().data_received(data)
        # counted by whole reads, checked once the parser has had them: a read that ends the headers and
        # carries a body is no header too large, and memory grows by one read past the cap at most
        if counting and self._head_bytes is not None and self._head_bytes > self.limits.max_header_bytes:
            self._refuse_head()

    def _refuse_head(self) -> None:
        self._head_bytes = None
        self._disarm()
        if self.transport.is_closing():
            return
        self.closures.note(f"request line and headers over {self.limits.max_header_bytes} bytes", self.loop)
        body = (b'{"error": {"code": "headers_too_large", "message": "the request line and headers are over '
                + str(self.limits.max_header_bytes).encode() + b' bytes"}}')
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                             b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
        self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:  # a request after the first on a kept-alive connection
            self._arm(self.limits.header_timeout_s, "request line and headers")

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        self._disarm()
        super().on_headers_complete()
        # cancelled at once by on_message_complete when there is no body (a GET)
        self._arm(self.limits.body_timeout_s, "body")

    def on_message_complete(self) -> None:
        self._disarm()
        self._head_bytes = 0  # the next request on a kept-alive connection
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired, what, seconds)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self, what: str, seconds: float) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.closures.note(f"{what} not received within {seconds:g} s", self.loop)
            # the app, if it was reading the body, sees the client disconnect
            self.transport.close()


def guarded_protocol(limits: ConnectionLimits, cap: int, where: str) -> type[HttpToolsProtocol]:
    """A protocol class for one listener (``where`` names it in the log): its own cap and its own count."""
    return type("GuardedProtocol", (_GuardedProtocol,),
                {"limits": limits, "cap": cap, "closures": _Closures(where)})
