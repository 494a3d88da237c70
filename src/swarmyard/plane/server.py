"""Serving the control plane with uvicorn: a Unix socket (the default, for sandboxes) and optionally TCP.

TCP on a loopback address may be plain; TCP on any other address requires mutual TLS (a server certificate
and a CA that client certificates must chain to; ``swarmyard certs init`` makes all three). ``serve`` runs in
the foreground until SIGINT/SIGTERM; ``BackgroundServer`` runs the same servers on a thread, for the
in-process control plane of ``swarmyard run`` and for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import ipaddress
import signal
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from swarmyard.errors import UserError


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The server's certificate and key, and the CA that every client certificate must chain to."""

    cert: Path
    key: Path
    ca: Path


@dataclass(frozen=True, slots=True)
class Listen:
    """Where the control plane listens."""

    socket_path: Path | None
    tcp_host: str | None = None
    tcp_port: int = 0
    tls: TlsFiles | None = None


def is_loopback(host: str) -> bool:
    """Whether ``host`` only reaches this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen(listen: Listen) -> None:
    """Refuse a listening setup that would expose the plane (``UserError`` naming what is missing)."""
    if listen.socket_path is None and listen.tcp_host is None:
        raise UserError("nothing to listen on: give a socket path, a TCP host, or both")
    if listen.tcp_host is not None and not is_loopback(listen.tcp_host) and listen.tls is None:
        raise UserError(f"TCP on {listen.tcp_host} (beyond loopback) requires mutual TLS: pass --tls-cert, "
                        "--tls-key and --tls-ca (make them with `swarmyard certs init`)")
    if listen.tls is not None:
        for path in (listen.tls.cert, listen.tls.key, listen.tls.ca):
            if not path.is_file():
                raise UserError(f"TLS file {path} does not exist")


def _fast_parts() -> dict[str, str]:
    # httptools and uvloop roughly double throughput; fall back to the pure-Python parts when absent.
    parts = {"http": "h11", "loop": "asyncio"}
    if importlib.util.find_spec("httptools") is not None:
        parts["http"] = "httptools"
    if importlib.util.find_spec("uvloop") is not None:
        parts["loop"] = "uvloop"
    return parts


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to ``serve`` (two servers share one set of handlers)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _servers(app: ASGIApp, listen: Listen, log_level: str) -> list[_Server]:
    check_listen(listen)
    parts = _fast_parts()
    common: dict[str, Any] = {"log_level": log_level, "access_log": False, "lifespan": "off",
                              "http": parts["http"], "backlog": 4096, "timeout_keep_alive": 30}
    servers = []
    if listen.socket_path is not None:
        listen.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            listen.socket_path.unlink()  # a stale socket from a previous run would make bind fail
        servers.append(_Server(uvicorn.Config(app, uds=str(listen.socket_path), **common)))
    if listen.tcp_host is not None:
        tls: dict[str, Any] = {}
        if listen.tls is not None:
            tls = {"ssl_certfile": str(listen.tls.cert), "ssl_keyfile": str(listen.tls.key),
                   "ssl_ca_certs": str(listen.tls.ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}
        servers.append(_Server(uvicorn.Config(app, host=listen.tcp_host, port=listen.tcp_port,
                                              **common, **tls)))
    return servers


def tcp_port(server: uvicorn.Server) -> int | None:
    """The TCP port a started server is bound to (useful with port 0)."""
    for srv in getattr(server, "servers", []):
        for sock in srv.sockets:
            name = sock.getsockname()
            if isinstance(name, tuple):
                return int(name[1])
    return None


async def serve_async(app: ASGIApp, listen: Listen, *, log_level: str = "warning",
                      stop: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set (or, on the main thread, SIGINT/SIGTERM)."""
    servers = _servers(app, listen, log_level)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

    async def watch() -> None:
        await stop.wait()
        for server in servers:
            server.should_exit = True

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.gather(*(server.serve() for server in servers))
    finally:
        watcher.cancel()
        if listen.socket_path is not None:
            with contextlib.suppress(FileNotFoundError):
                listen.socket_path.unlink()


def serve(app: ASGIApp, listen: Listen, *, log_level: str = "warning") -> None:
    """Serve in the foreground until interrupted."""
    if _fast_parts()["loop"] == "uvloop":
        import uvloop

        uvloop.run(serve_async(app, listen, log_level=log_level))
    else:
        asyncio.run(serve_async(app, listen, log_level=log_level))


class BackgroundServer:
    """The same servers on a background thread: ``with BackgroundServer(app, listen) as srv: ...``."""

    def __init__(self, app: ASGIApp, listen: Listen, *, log_level: str = "warning") -> None:
        self._app = app
        self.listen = listen
        self._log_level = log_level
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._servers: list[_Server] = []
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="swarmyard-plane", daemon=True)
        self.tcp_port: int | None = None

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:  # surfaced to the starting thread by start()
            self._error = exc
            self._started.set()
        finally:
            loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        self._servers = _servers(self._app, self.listen, self._log_level)
        tasks = [asyncio.create_task(server.serve()) for server in self._servers]
        while not all(server.started for server in self._servers):
            if any(t.done() for t in tasks):
                await asyncio.gather(*tasks)
                raise UserError("the control plane stopped while starting")
            await asyncio.sleep(0.01)
        if self.listen.tcp_host is not None:
            self.tcp_port = tcp_port(self._servers[-1])
        self._started.set()
        await self._stop.wait()
        for server in self._servers:
            server.should_exit = True
        await asyncio.gather(*tasks)

    def start(self, timeout_s: float = 30.0) -> BackgroundServer:
        """Start and wait until every server accepts connections."""
        self._thread.start()
        if not self._started.wait(timeout_s):
            raise UserError("the control plane did not start in time")
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        """Stop accepting, finish open requests, and join the thread."""
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
