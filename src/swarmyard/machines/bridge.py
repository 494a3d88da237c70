"""A node's way to a control plane it cannot see: a Unix socket whose connections go on over mutual TLS.

A Ray node on another host than the run's plane has no path to the plane's Unix socket. Its host actor (outside
every sandbox) then runs a :class:`PlaneBridge`: a Unix socket in the node's own folder, which that node's
machines bind as their control socket exactly as they would bind the plane's, and for each connection made to it
a TCP connection to the plane's TLS listener, presenting the run's client certificate and checking the plane's
against the run's CA. Bytes pass both ways unchanged (worker tokens still travel inside HTTP). The certificate and
key are loaded into memory and their files removed at once: nothing of them stays on the node's disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from swarmyard.errors import SandboxError
from swarmyard.secret_files import write_secret_file

log = logging.getLogger(__name__)

_CHUNK = 64 * 1024
#: How long a bridge waits for the plane's TLS handshake before it drops the machine's connection.
CONNECT_TIMEOUT_S = 30.0
#: How old a bridge's folder without a socket must be before it counts as left over (one starting has none).
STALE_EMPTY_S = 600.0


@dataclass(frozen=True, slots=True)
class PlaneTls:
    """Where a plane listens over mutual TLS, the CA its certificate chains to, and the client's certificate."""

    host: str
    port: int
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes


def client_context(tls: PlaneTls) -> ssl.SSLContext:
    """A TLS client context that trusts only ``tls``'s CA and presents its client certificate."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=tls.ca_pem.decode("ascii"))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # load_cert_chain reads files only: a private folder, 0600 files, gone as soon as they are read
    folder = Path(tempfile.mkdtemp(prefix="swarmyard-tls-"))
    try:
        write_secret_file(folder / "client.pem", tls.cert_pem)
        write_secret_file(folder / "client.key", tls.key_pem)
        context.load_cert_chain(folder / "client.pem", folder / "client.key")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return context


class PlaneBridge:
    """A Unix socket at ``path`` that forwards each connection to the plane over mutual TLS, on its own thread."""

    def __init__(self, path: Path, tls: PlaneTls) -> None:
        self.path = path
        self.tls = tls
        self._context = client_context(tls)
        #: connections forwarded: the plane's TLS handshake done, the machine's bytes on their way
        self.forwarded = 0
        #: connections dropped because the plane could not be reached over TLS
        self.failed = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        #: each connection's task: the event loop holds tasks only weakly, and Python 3.11's stream server keeps
        #: none, so a connection whose client has half-closed (its socket no longer watched) could be collected
        self._connections: set[asyncio.Task[None]] = set()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="swarmyard-bridge", daemon=True)

    def start(self, timeout_s: float = 30.0) -> PlaneBridge:
        """Listen on the Unix socket; return once it accepts connections."""
        self._thread.start()
        if not self._started.wait(timeout_s) or self._error is not None:
            raise SandboxError(f"the plane bridge at {self.path} did not start: {self._error}")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._listen())
        except BaseException as exc:  # surfaced to start()
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
        self._loop.close()

    async def _listen(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._accept, path=str(self.path))
        os.chmod(self.path, 0o666)  # as the plane's own socket: sandboxed workers may run as other users

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = self._loop.create_task(self._serve(reader, writer))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(self.tls.host, self.tls.port, ssl=self._context,
                                        server_hostname=self.tls.host),
                CONNECT_TIMEOUT_S)
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            self.failed += 1
            log.warning("plane bridge: cannot reach the plane at %s:%d over TLS: %s", self.tls.host,
                        self.tls.port, exc)
            writer.close()
            return
        self.forwarded += 1
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            up_writer.close()
            writer.close()

    async def _shutdown(self) -> None:
        """Stop accepting, and end every connection's copying (each closes both of its ends as it ends)."""
        if self._server is not None:
            self._server.close()
        here = asyncio.current_task()
        open_ones = [task for task in asyncio.all_tasks() if task is not here]
        for task in open_ones:
            task.cancel()
        await asyncio.gather(*open_ones, return_exceptions=True)

    def close(self) -> None:
        """Stop listening, drop open connections and remove the socket."""
        if self._thread.is_alive():
            done = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
            with contextlib.suppress(Exception):
                done.result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self.path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.path.parent.rmdir()  # the bridge's own folder, when nothing else was put there


def reap_stale(folder: Path) -> list[str]:
    """Remove the bridges in ``folder`` whose host died without closing them (a SIGKILL, as Ray gives the actors
    of a driver that died): a socket no process listens on any more, and its folder. Returns their names."""
    reaped: list[str] = []
    try:
        found = sorted(folder.iterdir())
    except FileNotFoundError:
        return reaped
    for bridge in found:
        path = bridge / "plane.sock"
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            shutil.rmtree(bridge, ignore_errors=True)  # nothing listens: its host is gone
            reaped.append(bridge.name)
        except FileNotFoundError:
            # no socket: a bridge starting now, or the empty folder of one closed before it removed its folder
            with contextlib.suppress(OSError):
                if time.time() - bridge.stat().st_mtime > STALE_EMPTY_S:
                    bridge.rmdir()  # only if empty
                    reaped.append(bridge.name)
        except OSError:
            pass  # not ours to judge
        finally:
            probe.close()
    return reaped


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until ``reader`` ends, then end ``writer``'s side (a half-close, as HTTP clients may do)."""
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        # TLS has no half-close: the plane's side stays open for its answer, and closes when the other way ends
    except (OSError, ssl.SSLError):
        writer.close()
    finally:
        with contextlib.suppress(OSError, ssl.SSLError, RuntimeError):
            await writer.drain()
