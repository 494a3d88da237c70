"""One address for several control-plane replicas: ``SWARMYARD_PLANE_URL=https://a:8787,https://b:8787``.

An httpx transport over one inner transport per replica. A request goes to the replica that answered last;
when that one cannot be reached (connection refused, host unreachable, connect timed out, TLS refused: no byte
of the request was sent), the same request goes to the next one, round the list once, and the first that
answers is used from then on. Nothing else moves on: a request whose connection died after it was sent may
have been served, and a model call may have been admitted and sent upstream, so its error reaches the caller
as it came (the broker's ``unknown``; the agent never resends such a call). The only exception is a request
that is safe to repeat: ``GET``/``HEAD``, the worker tools that only read, and ``heartbeat`` (renewing the
same fenced claim twice is renewing it once); those also move on after a lost connection.

Any replica serves any request (they share the store), so there is no stickiness to keep beyond "the last
one that answered". The replicas must serve the same paths: each URL may have its own host, port and scheme.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import httpx

from swarmyard.errors import UserError

log = logging.getLogger(__name__)

#: Nothing was sent: any request may go to the next replica.
_UNREACHED = (httpx.ConnectError, httpx.ConnectTimeout)
#: Tools that change nothing, or nothing twice: repeated on the next replica even after a lost answer.
_REPEATABLE_TOOLS = frozenset({"board_read", "read_findings", "read_directions", "heartbeat"})


def parse_urls(where: str) -> tuple[str, ...]:
    """The replicas of a comma-separated address, each an ``http://`` or ``https://`` URL."""
    urls = tuple(part.strip().rstrip("/") for part in where.split(",") if part.strip())
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if not urls or bad:
        raise UserError(f"a control plane address is one URL or a comma-separated list of http(s) URLs, got "
                        f"{where!r}")
    return urls


def repeatable(request: httpx.Request) -> bool:
    """Whether ``request`` may be sent again after its answer was lost."""
    if request.method in ("GET", "HEAD"):
        return True
    path = request.url.path
    return path.startswith("/v1/tools/") and path.removeprefix("/v1/tools/") in _REPEATABLE_TOOLS


class _Rotation:
    """The replicas in the order to try them: the one that answered last first."""

    def __init__(self, urls: Sequence[str]) -> None:
        if not urls:
            raise UserError("no control plane replica given")
        self.urls = [httpx.URL(u) for u in urls]
        self._current = 0
        self._lock = threading.Lock()

    def order(self) -> list[int]:
        with self._lock:
            start = self._current
        return [(start + i) % len(self.urls) for i in range(len(self.urls))]

    def answered(self, index: int) -> None:
        with self._lock:
            if self._current != index:
                log.info("control plane replica %s answers", self.urls[index])
            self._current = index

    def aim(self, request: httpx.Request, index: int) -> None:
        """Point ``request`` (built against the first replica's URL) at replica ``index``."""
        first, target = self.urls[0], self.urls[index]
        path = request.url.raw_path
        base = first.raw_path.rstrip(b"/")
        if base and path.startswith(base):
            path = path[len(base):]
        request.url = request.url.copy_with(scheme=target.scheme, host=target.host, port=target.port,
                                            raw_path=target.raw_path.rstrip(b"/") + path)
        request.headers["host"] = target.netloc.decode("ascii")


def _moves_on(exc: httpx.TransportError, request: httpx.Request) -> bool:
    return isinstance(exc, _UNREACHED) or repeatable(request)


class AsyncFailoverTransport(httpx.AsyncBaseTransport):
    """``httpx.AsyncClient(base_url=urls[0], transport=AsyncFailoverTransport(urls))``."""

    def __init__(self, urls: Sequence[str],
                 make: Callable[[httpx.URL], httpx.AsyncBaseTransport] | None = None) -> None:
        self._rotation = _Rotation(urls)
        build = make or (lambda url: httpx.AsyncHTTPTransport())
        self._inner = [build(url) for url in self._rotation.urls]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` to the first replica that can be reached (see the module's docstring)."""
        await request.aread()  # a body is sent whole, so it can be sent again
        last: httpx.TransportError | None = None
        for index in self._rotation.order():
            self._rotation.aim(request, index)
            try:
                response = await self._inner[index].handle_async_request(request)
            except httpx.TransportError as exc:
                if not _moves_on(exc, request):
                    raise
                log.warning("control plane replica %s: %s; trying the next", self._rotation.urls[index], exc)
                last = exc
                continue
            self._rotation.answered(index)
            return response
        assert last is not None
        raise last

    async def aclose(self) -> None:
        """Close every replica's transport."""
        for inner in self._inner:
            await inner.aclose()


class FailoverTransport(httpx.BaseTransport):
    """The blocking twin: ``httpx.Client(base_url=urls[0], transport=FailoverTransport(urls))``."""

    def __init__(self, urls: Sequence[str], make: Callable[[httpx.URL], httpx.BaseTransport] | None = None) -> None:
        self._rotation = _Rotation(urls)
        build = make or (lambda url: httpx.HTTPTransport())
        self._inner = [build(url) for url in self._rotation.urls]

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` to the first replica that can be reached (see the module's docstring)."""
        request.read()
        last: httpx.TransportError | None = None
        for index in self._rotation.order():
            self._rotation.aim(request, index)
            try:
                response = self._inner[index].handle_request(request)
            except httpx.TransportError as exc:
                if not _moves_on(exc, request):
                    raise
                log.warning("control plane replica %s: %s; trying the next", self._rotation.urls[index], exc)
                last = exc
                continue
            self._rotation.answered(index)
            return response
        assert last is not None
        raise last

    def close(self) -> None:
        """Close every replica's transport."""
        for inner in self._inner:
            inner.close()
