"""An HTTP client for the control plane (over its Unix socket or a URL), used by the MCP relay and the CLI.

Worker code reads its connection from the environment it was given (never the host's): ``SWARMYARD_TOKEN``
plus ``SWARMYARD_PLANE_SOCKET`` (a Unix socket path) or ``SWARMYARD_PLANE_URL``: one URL, or several replicas'
URLs separated by commas, reached with failover (``swarmyard.plane.failover``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from swarmyard.errors import UserError
from swarmyard.plane.failover import AsyncFailoverTransport, FailoverTransport, parse_urls

_BASE = "http://plane"


@dataclass(frozen=True, slots=True)
class PlaneAddress:
    """Where the control plane is: a Unix socket path, or the http(s) URLs of its replicas (one or more)."""

    socket_path: str | None = None
    urls: tuple[str, ...] = ()

    @property
    def url(self) -> str | None:
        """The first replica's URL (None for a socket)."""
        return self.urls[0] if self.urls else None

    @classmethod
    def parse(cls, where: str) -> PlaneAddress:
        """``http://...``/``https://...`` is a URL (a comma-separated list: replicas); anything else is a socket
        path."""
        if where.startswith(("http://", "https://")):
            return cls(urls=parse_urls(where))
        return cls(socket_path=where)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PlaneAddress:
        """The address a worker was given in its environment."""
        if env.get("SWARMYARD_PLANE_SOCKET"):
            return cls(socket_path=env["SWARMYARD_PLANE_SOCKET"])
        if env.get("SWARMYARD_PLANE_URL"):
            return cls.parse(env["SWARMYARD_PLANE_URL"])
        raise UserError("set SWARMYARD_PLANE_SOCKET (a Unix socket path) or SWARMYARD_PLANE_URL")

    def async_client(self, token: str, *, timeout_s: float = 60.0) -> httpx.AsyncClient:
        """An async client that sends ``token`` on every request."""
        headers = {"authorization": f"Bearer {token}"}
        if self.socket_path is not None:
            return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=self.socket_path), base_url=_BASE,
                                     headers=headers, timeout=timeout_s)
        if len(self.urls) > 1:
            return httpx.AsyncClient(base_url=self.urls[0], transport=AsyncFailoverTransport(self.urls),
                                     headers=headers, timeout=timeout_s)
        return httpx.AsyncClient(base_url=self.url or _BASE, headers=headers, timeout=timeout_s)

    def client(self, token: str, *, timeout_s: float = 60.0) -> httpx.Client:
        """A blocking client that sends ``token`` on every request."""
        headers = {"authorization": f"Bearer {token}"}
        if self.socket_path is not None:
            return httpx.Client(transport=httpx.HTTPTransport(uds=self.socket_path), base_url=_BASE,
                                headers=headers, timeout=timeout_s)
        if len(self.urls) > 1:
            return httpx.Client(base_url=self.urls[0], transport=FailoverTransport(self.urls), headers=headers,
                                timeout=timeout_s)
        return httpx.Client(base_url=self.url or _BASE, headers=headers, timeout=timeout_s)


def decode(response: httpx.Response) -> Any:
    """The JSON body of a response (``{"error": ...}`` for errors; non-JSON bodies are wrapped)."""
    try:
        return response.json()
    except ValueError:
        return {"error": {"code": "bad_response", "message": response.text[:500], "retryable": False}}
