"""Loopback ports and servers."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago (for a server the test starts as a process).

    The port is released before it is returned, so another process could take it first: a server started on it
    that fails to bind says so, it does not hang.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on a free loopback port, a thread per connection, until the block ends; yields its base
    URL (``http://127.0.0.1:PORT``)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def stream_server(handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]) -> Iterator[int]:
    """Serve ``handle`` (an asyncio connection handler: an upstream written on the bare socket) on a free loopback
    port, on an event loop of its own in a thread, until the block ends; yields the port. At the end the server
    closes and the handlers still running are cancelled."""
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:

        async def shutdown() -> None:
            server.close()
            pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
