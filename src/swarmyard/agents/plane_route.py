"""Whether the built-in agent reaches the plane with its lean client: read from the environment alone, before the
agent imports its loop (``python -m swarmyard.agents`` decides from it whether TLS can be left out)."""

from __future__ import annotations

from urllib.parse import urlsplit

#: ``(host, where)``: the ``Host`` the requests name, and where they go: the plane's Unix socket (a path) or the
#: loopback port of the machine's relay.
LeanRoute = tuple[str, str | int]


def lean_route(plane_url: str, socket: str | None) -> LeanRoute | None:
    """The lean client's route to the plane, where it serves: the plane's socket, or a plain ``http`` loopback URL
    with a port and no path, query or user; ``None`` for anything else (TLS, several replicas, a path), which
    httpx serves."""
    if not socket and "," in plane_url:
        return None  # several replicas: failover
    try:
        url = urlsplit(plane_url)
        port = url.port
    except ValueError:
        return None
    if url.path.strip("/") or url.query or url.username is not None or url.password is not None:
        return None
    if socket:
        return url.netloc, socket
    if url.scheme == "http" and url.hostname in ("127.0.0.1", "localhost") and port is not None:
        return url.netloc, port
    return None
