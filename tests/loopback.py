"""Serve an ASGI app on a free loopback port in a background thread, for the tests."""

from __future__ import annotations

import importlib.util
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


@contextmanager
def serve_in_thread(app: Any, *, host: str = "127.0.0.1", startup_timeout_s: float = 10.0) -> Iterator[str]:
    """Run ``app`` with uvicorn until the block ends; yields its base URL."""
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets that say so, and without it
    # Nagle plus delayed ACKs add ~40 ms to every reply on a kept-alive connection
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan="on",
        # the parts `swarmyard broker serve` (uvicorn's "auto") runs with, so a benchmark measures what
        # production runs: uvloop and the httptools parser where installed, the pure-Python pair otherwise
        loop="uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio",
        http="httptools" if importlib.util.find_spec("httptools") is not None else "h11",
        timeout_graceful_shutdown=2,
        backlog=4096,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="loopback-server", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the loopback server did not start")
        time.sleep(0.005)  # polling a flag uvicorn sets; there is no event to wait on
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(startup_timeout_s)
        sock.close()
