"""``swarmyard serve`` against slow clients: a request line or headers left half-sent, and a body shorter than its
Content-Length (``POST /ui/login`` needs no token), are closed at their deadline, and said so in the log; a
listener holds at most ``--max-connections``, and when TCP is full of them the workers' Unix socket still
answers, as does TCP below the cap. ``swarmyard broker serve`` has the same guards."""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from rigs.network import free_port as _free_port

_SAFETY_S = 60  # only so a regression fails instead of hanging: a closed connection reads b"" well before


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-sc-"))  # short: Unix socket paths are limited
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextmanager
def _serve(folder: Path, *flags: str) -> Iterator[tuple[int, Path, Path]]:
    """A real ``swarmyard serve`` on loopback; yields (TCP port, Unix socket, its stderr file) once it answers."""
    port, sock, log = _free_port(), folder / "p.sock", folder / "serve.log"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "swarmyard.cli", "serve", "--socket", str(sock),
                                 "--store", f"sqlite:///{folder / 'store.db'}", "--secret-file",
                                 str(folder / "secret"), "--operator-token-file", str(folder / "operator-token"),
                                 "--host", "127.0.0.1", "--port", str(port), *flags],
                                cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        _until_up(port, proc)
        yield port, sock, log
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _until_up(port: int, proc: subprocess.Popen[bytes]) -> None:
    # the transport retries refused connections (with a backoff) while the server binds
    with httpx.Client(timeout=_SAFETY_S, transport=httpx.HTTPTransport(retries=20)) as client:
        assert client.get(f"http://127.0.0.1:{port}/healthz").status_code == 200, proc.poll()


def _half_sent(port: int, data: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=_SAFETY_S)
    s.sendall(data)
    return s


def _closed(s: socket.socket) -> bool:
    """Whether the server closed ``s`` (reads end of stream) without answering."""
    try:
        return s.recv(4096) == b""
    except ConnectionResetError:
        return True
    finally:
        s.close()


def _healthz_tcp(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=_SAFETY_S)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status
    finally:
        conn.close()


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=_SAFETY_S)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(_SAFETY_S)
        self.sock.connect(str(self._path))


def _healthz_unix(path: Path) -> int:
    conn = _UnixConnection(path)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status
    finally:
        conn.close()


def test_half_sent_headers_and_short_bodies_are_closed_at_their_deadline(folder: Path) -> None:
    with _serve(folder, "--header-timeout-s", "0.2", "--body-timeout-s", "0.2") as (port, _, log):
        assert _closed(_half_sent(port, b"GET /healthz HTT"))
        assert _closed(_half_sent(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n"))
        # the dashboard's own host (another is answered 421 at once, before its body is waited for)
        assert _closed(_half_sent(port, b"POST /ui/login HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: "
                                        b"application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\n"
                                        b"token=ab" % port))
        # a kept-alive connection gets the same deadline for its next request's headers
        kept = _half_sent(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = http.client.HTTPResponse(kept)
        first.begin()
        assert first.status == 200 and first.read()
        kept.sendall(b"GET /healthz HTTP/1.1\r\n")
        assert _closed(kept)
        # and a request that arrives whole is served
        assert _healthz_tcp(port) == 200
    said = log.read_text()
    assert "request line and headers not received within 0.2 s" in said, said
    assert "Traceback" not in said, said


def test_a_full_tcp_listener_leaves_the_unix_socket_and_tcp_below_the_cap_usable(folder: Path) -> None:
    cap = 30
    with _serve(folder, "--max-connections", str(cap)) as (port, sock, log), ExitStack() as held:
        def slow() -> socket.socket:
            s = _half_sent(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            held.callback(s.close)
            return s

        for _ in range(cap - 10):
            slow()
        assert _healthz_tcp(port) == 200  # below the cap, with 20 slow connections open
        # the legitimate connection above may still count for a moment: 10 more fill the cap for sure
        more = [slow() for _ in range(20)]
        assert _closed(more[-1])  # past the cap: closed as it arrives
        assert _healthz_unix(sock) == 200  # the workers' path answers while TCP is full
    assert f"over the cap of {cap} open connections" in log.read_text()


def test_broker_serve_closes_half_sent_headers_too(folder: Path) -> None:
    port = _free_port()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    with (folder / "broker.log").open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "swarmyard.cli", "broker", "serve", "--store",
                                 f"sqlite:///{folder / 'store.db'}", "--port", str(port), "--secret-file",
                                 str(folder / "secret"), "--provider", "sim=simulated:sim-1"],
                                cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        with httpx.Client(timeout=_SAFETY_S, transport=httpx.HTTPTransport(retries=20)) as client:
            assert client.get(f"http://127.0.0.1:{port}/v1/models").status_code in (200, 401), proc.poll()
        # the default deadline (no flag on this command): closed, not kept
        assert _closed(_half_sent(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert "request line and headers not received within 10 s" in (folder / "broker.log").read_text()


def _huge_header(path: Path) -> tuple[int, bytes]:
    """Send a request whose one header line would run to 64 MiB: how many of its bytes the server let in before
    it closed, and what it answered."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(_SAFETY_S)
        sock.connect(str(path))
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sent, block = 0, b"a" * (1 << 20)
        try:
            while sent < 64 << 20:
                sock.sendall(block)
                sent += len(block)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
    return sent, answer


def test_headers_past_64_kib_are_answered_431_and_not_read_but_a_large_body_is(folder: Path) -> None:
    with _serve(folder) as (_, sock, log):
        sent, answer = _huge_header(sock)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:300]
        assert sent < 8 << 20, sent  # the server stopped reading: the rest never reached its memory
        # a body is no header: 1 MiB of it arrives in reads with the headers and is read (the login refuses it)
        conn = _UnixConnection(sock)
        try:
            conn.request("POST", "/ui/login", body=b"token=" + b"a" * (1 << 20),
                         headers={"content-type": "application/x-www-form-urlencoded"})
            assert conn.getresponse().status != 431
        finally:
            conn.close()
        assert _healthz_unix(sock) == 200
    assert "request line and headers over 65536 bytes" in log.read_text()
