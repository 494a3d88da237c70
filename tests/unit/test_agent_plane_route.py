"""Which plane addresses the built-in agent's lean client serves (the rest go through httpx, with TLS)."""

from __future__ import annotations

import pytest

from swarmyard.agents.plane_route import lean_route


@pytest.mark.parametrize(("url", "socket", "route"), [
    ("http://127.0.0.1:8431", None, ("127.0.0.1:8431", 8431)),
    ("http://localhost:8431/", None, ("localhost:8431", 8431)),
    ("http://plane", "/run/plane.sock", ("plane", "/run/plane.sock")),
])
def test_the_relay_and_the_socket_are_lean(url: str, socket: str | None, route: tuple[str, str | int]) -> None:
    assert lean_route(url, socket) == route


@pytest.mark.parametrize("url", [
    "https://127.0.0.1:8431",  # TLS
    "http://127.0.0.1",  # no port
    "http://10.0.0.5:8431",  # not loopback
    "http://127.0.0.1:1,http://127.0.0.1:2",  # replicas: failover
    "http://127.0.0.1:8431/v1",  # a path
    "http://127.0.0.1:8431/?a=1",  # a query
    "http://me:pw@127.0.0.1:8431",  # a user
    "http://127.0.0.1:99999",  # a port out of range
])
def test_anything_else_is_httpx(url: str) -> None:
    assert lean_route(url, None) is None
