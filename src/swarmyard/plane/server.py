"""Serving the control plane with uvicorn: a Unix socket (the default, for sandboxes) and optionally TCP.

TCP on a loopback address may be plain; TCP on any other address requires mutual TLS (a server certificate
and a CA that client certificates must chain to; ``swarmyard certs init`` makes all three). ``serve`` runs in
the foreground until SIGINT/SIGTERM; ``serve_processes`` does the same from several forked processes that
share the listening sockets (each with its own event loop, store connections and GIL: the plane is stateless,
everything it must agree on lives in the store); ``BackgroundServer`` runs the same servers on a thread, for
the in-process control plane of ``swarmyard run`` and for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
import ipaddress
import logging
import os
import signal
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from swarmyard.errors import UserError
from swarmyard.plane.connections import ConnectionLimits, guarded_protocol

log = logging.getLogger(__name__)


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
    # uvloop roughly doubles throughput; fall back to asyncio's loop when absent. (httptools, the other half,
    # is a dependency: the connection guards are built on its protocol.)
    parts = {"loop": "asyncio"}
    if importlib.util.find_spec("uvloop") is not None:
        parts["loop"] = "uvloop"
    return parts


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to ``serve`` (two servers share one set of handlers).

    ``bound`` holds sockets bound before this process started serving (``serve_processes``), else None.
    """

    bound: list[socket.socket] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _common(log_level: str) -> dict[str, Any]:
    # ws off: the plane has no WebSocket routes, and an upgraded connection would leave the guards' protocol
    return {"log_level": log_level, "access_log": False, "lifespan": "off", "ws": "none",
            "backlog": 4096, "timeout_keep_alive": 30,
            # Nothing sits in front of the plane: X-Forwarded-* headers are not to be believed, nor parsed.
            "proxy_headers": False}


def _tls(listen: Listen) -> dict[str, Any]:
    if listen.tls is None:
        return {}
    return {"ssl_certfile": str(listen.tls.cert), "ssl_keyfile": str(listen.tls.key),
            "ssl_ca_certs": str(listen.tls.ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}


def _listeners(listen: Listen) -> int:
    return (listen.socket_path is not None) + (listen.tcp_host is not None)


def _servers(app: ASGIApp, listen: Listen, log_level: str,
             sockets: tuple[socket.socket | None, socket.socket | None] | None = None,
             limits: ConnectionLimits | None = None, listeners: int | None = None) -> list[_Server]:
    """One uvicorn server per address; with ``sockets`` (Unix, TCP) they serve those instead of binding.
    ``listeners``: how many listeners of this process share the open-files limit (``listen``'s by default)."""
    check_listen(listen)
    common = _common(log_level)
    limits = limits or ConnectionLimits()
    cap = limits.cap(listeners=listeners or _listeners(listen))
    # asyncio accepts up to the backlog at once, and a connection over the cap holds its descriptor until the
    # loop comes round to close it: a burst no larger than a share of the cap keeps a flood within the limit
    common["backlog"] = min(common["backlog"], limits.burst(cap))
    servers = []
    if listen.socket_path is not None:
        if sockets is None:
            listen.socket_path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                listen.socket_path.unlink()  # a stale socket from a previous run would make bind fail
        server = _Server(uvicorn.Config(app, uds=str(listen.socket_path), **common,
                                        http=guarded_protocol(limits, cap, f"unix:{listen.socket_path}")))
        server.bound = None if sockets is None or sockets[0] is None else [sockets[0]]
        servers.append(server)
    if listen.tcp_host is not None:
        server = _Server(uvicorn.Config(app, host=listen.tcp_host, port=listen.tcp_port, **common, **_tls(listen),
                                        http=guarded_protocol(limits, cap, f"{listen.tcp_host}:{listen.tcp_port}")))
        server.bound = None if sockets is None or sockets[1] is None else [sockets[1]]
        servers.append(server)
    return servers


def bind(listen: Listen) -> tuple[socket.socket | None, socket.socket | None]:
    """Bind and listen on ``listen``'s Unix socket and TCP address once, for several processes to share."""
    check_listen(listen)
    unix = tcp = None
    if listen.socket_path is not None:
        listen.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            listen.socket_path.unlink()
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.bind(str(listen.socket_path))
        os.chmod(listen.socket_path, 0o666)  # as uvicorn does: sandboxed workers may run as other users
        unix.listen(4096)
    if listen.tcp_host is not None:
        family = socket.AF_INET6 if ":" in listen.tcp_host else socket.AF_INET
        tcp = socket.create_server((listen.tcp_host, listen.tcp_port), family=family, backlog=4096)
    return unix, tcp


def tcp_port(server: uvicorn.Server) -> int | None:
    """The TCP port a started server is bound to (useful with port 0)."""
    for srv in getattr(server, "servers", []):
        for sock in srv.sockets:
            name = sock.getsockname()
            if isinstance(name, tuple):
                return int(name[1])
    return None


async def serve_async(app: ASGIApp, listen: Listen, *, log_level: str = "warning",
                      stop: asyncio.Event | None = None, limits: ConnectionLimits | None = None) -> None:
    """Run until ``stop`` is set (or, on the main thread, SIGINT/SIGTERM)."""
    await _serve_async(app, listen, log_level, stop, None, limits)


async def _serve_async(app: ASGIApp, listen: Listen, log_level: str, stop: asyncio.Event | None,
                       sockets: tuple[socket.socket | None, socket.socket | None] | None,
                       limits: ConnectionLimits | None = None, stopped: threading.Event | None = None) -> None:
    servers = _servers(app, listen, log_level, sockets, limits)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    interrupted = False

    def on_signal(signum: int) -> None:
        nonlocal interrupted
        interrupted = interrupted or signum == signal.SIGINT
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
    if stopped is not None and stopped.is_set():  # a SIGTERM before the handlers above: a stop all the same
        stop.set()

    async def watch() -> None:
        await stop.wait()
        stopping(app)
        for server in servers:
            server.should_exit = True

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.gather(*(server.serve(sockets=server.bound) for server in servers))
    finally:
        watcher.cancel()
        if listen.socket_path is not None and sockets is None:  # a shared socket is its binder's to remove
            with contextlib.suppress(FileNotFoundError):
                listen.socket_path.unlink()
        # What the app asked to run once no request is in flight (the mounted broker's end: its queued
        # settlements written, its providers closed); uvicorn's lifespan is off here, so this is the hook.
        for close in getattr(getattr(app, "state", None), "on_close", ()):
            try:
                await close()
            except Exception:
                log.exception("closing the app failed")
    if interrupted:  # after a clean shutdown: Ctrl-C is exit 130, SIGTERM (a supervisor's stop) exit 0
        raise KeyboardInterrupt


def stopping(app: ASGIApp) -> None:
    """Tell the app its server is stopping (``app.state.on_stop``): requests that would never end on their own,
    such as the dashboard's event streams, finish, and the server's wait for open requests ends."""
    for hook in getattr(getattr(app, "state", None), "on_stop", ()):
        try:
            hook()
        except Exception:
            log.exception("stopping the app failed")


def _run(main: Any) -> None:
    # A long-lived server: what was built at start-up (modules, app, routes) is frozen out of the collector's
    # way, and young objects are collected 30x less often (a pass over a busy heap sits on the request path).
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    if _fast_parts()["loop"] == "uvloop":
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)


def serve(app: ASGIApp, listen: Listen, *, log_level: str = "warning", limits: ConnectionLimits | None = None,
          sockets: tuple[socket.socket | None, socket.socket | None] | None = None,
          stopped: threading.Event | None = None) -> None:
    """Serve in the foreground until interrupted; on ``sockets`` already bound (``bind``), if given. ``stopped``:
    set by the caller's own SIGTERM handler before the server's are in place (it stops at once, cleanly)."""
    _run(_serve_async(app, listen, log_level, None, sockets, limits, stopped))


def serve_processes(make_app: Callable[[], ASGIApp], listen: Listen, processes: int, *,
                    log_level: str = "warning", limits: ConnectionLimits | None = None,
                    sockets: tuple[socket.socket | None, socket.socket | None] | None = None) -> None:
    """Serve from ``processes`` forked processes sharing the listening sockets, until SIGINT/SIGTERM.

    ``make_app`` runs in each child after the fork, so every process opens its own store connections and
    starts its own threads (neither survives a fork). The caller must hold no threads and no open store
    when it calls this. A child that dies stops the whole server (exit code 1): a supervisor restarts it,
    as it would a single process. Fork, not spawn: the children need the parent's configuration, provider
    keys included, and a spawned child would have to be handed the environment.
    """
    if processes < 1:
        raise UserError("--workers must be at least 1")
    sockets = sockets or bind(listen)
    children: set[int] = set()
    stopping = interrupted = False

    def forward(signum: int, frame: object) -> None:
        nonlocal stopping, interrupted
        stopping = True
        interrupted = interrupted or signum == signal.SIGINT
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    failed = False
    try:
        for _ in range(processes):
            pid = os.fork()
            if pid == 0:  # the child serves until told to stop, and never returns into the parent's code
                code = 0
                children.clear()  # a signal before the handlers are restored must not reach the siblings
                try:
                    for sig, handler in previous.items():
                        signal.signal(sig, handler)
                    _run(_serve_async(make_app(), listen, log_level, None, sockets, limits))
                except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: a clean stop here too
                    pass
                except BaseException:
                    log.exception("control plane process %d failed", os.getpid())
                    code = 1
                finally:
                    os._exit(code)
            children.add(pid)
        while children:
            pid, status = os.wait()
            children.discard(pid)
            if not stopping:
                log.error("control plane process %d exited (status %d); stopping the others", pid, status)
                failed = True
                forward(signal.SIGTERM, None)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sock in sockets:
            if sock is not None:
                sock.close()
        if listen.socket_path is not None:
            with contextlib.suppress(FileNotFoundError):
                listen.socket_path.unlink()
    if failed:
        raise UserError("a control plane process exited unexpectedly (see the log above)")
    if interrupted:
        raise KeyboardInterrupt


class BackgroundServer:
    """The same servers on a background thread: ``with BackgroundServer(app, listen) as srv: ...``.

    ``also``: more addresses for the same app on the same loop (a run's plane serves its socket, a loopback
    dashboard and a TLS listener for nodes of other hosts at once); ``tcp_ports`` holds each one's bound port.
    ``bound``: the Unix sockets of ``listen`` and then of each of ``also``, bound and listening already (a
    connection made before the thread starts waits in the backlog; ``None`` for one to bind here).
    """

    def __init__(self, app: ASGIApp, listen: Listen, *, log_level: str = "warning",
                 limits: ConnectionLimits | None = None, also: tuple[Listen, ...] = (),
                 bound: tuple[socket.socket | None, ...] = ()) -> None:
        self._app = app
        self.listen = listen
        self.also = also
        self._bound = bound
        self._log_level = log_level
        self._limits = limits
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._servers: list[_Server] = []
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="swarmyard-plane", daemon=True)
        self.tcp_port: int | None = None
        #: the TCP port of each of ``also``'s addresses, once started (``None`` for one without TCP)
        self.tcp_ports: list[int | None] = []

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
        bound = [*self._bound, *[None] * (1 + len(self.also) - len(self._bound))]
        # every address shares this process's open files: each listener gets its share of all of them
        listeners = sum(_listeners(listen) for listen in (self.listen, *self.also))
        main = _servers(self._app, self.listen, self._log_level, limits=self._limits, listeners=listeners,
                        sockets=None if bound[0] is None else (bound[0], None))
        extra = [_servers(self._app, listen, self._log_level, limits=self._limits, listeners=listeners,
                          sockets=None if unix is None else (unix, None))
                 for listen, unix in zip(self.also, bound[1:], strict=True)]
        self._servers = main + [server for servers in extra for server in servers]
        tasks = [asyncio.create_task(server.serve(sockets=server.bound)) for server in self._servers]
        while not all(server.started for server in self._servers):
            if any(t.done() for t in tasks):
                await asyncio.gather(*tasks)
                raise UserError("the control plane stopped while starting")
            await asyncio.sleep(0.01)
        if self.listen.tcp_host is not None:
            self.tcp_port = tcp_port(main[-1])
        self.tcp_ports = [tcp_port(servers[-1]) if listen.tcp_host is not None else None
                          for listen, servers in zip(self.also, extra, strict=True)]
        self._started.set()
        await self._stop.wait()
        stopping(self._app)
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
