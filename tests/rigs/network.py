"""Loopback ports."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago (for a server the test starts as a process).

    The port is released before it is returned, so another process could take it first: a server started on it
    that fails to bind says so, it does not hang.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
