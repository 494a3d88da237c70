"""A Ray node's bridge to a plane it cannot see, against a real uvicorn server on loopback: the run's TLS
listener (its own CA, server and client certificate) answers requests made on the bridge's Unix socket; a bridge
that meets a plane whose certificate is not of the run's CA forwards nothing; the listener refuses a client
without the run's certificate; the client key's files are gone once the bridge has loaded it.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from swarmyard.machines.bridge import PlaneBridge
from swarmyard.plane.certs import init_certs
from swarmyard.plane.server import BackgroundServer, Listen
from swarmyard.swarm.plane_tls import FOLDER, PlaneListener, plane_listener


async def _hello(request: Request) -> Response:
    return Response(b"plane:" + await request.body())


_HELD = threading.Event()  # the plane has the held request
_RELEASE = threading.Event()  # the test lets it answer


async def _held(request: Request) -> Response:
    body = await request.body()
    _HELD.set()
    await anyio.to_thread.run_sync(_RELEASE.wait, 30)
    return Response(b"plane:" + body)


@pytest.fixture
def folder(monkeypatch: pytest.MonkeyPatch, short_tmp: Path) -> Path:
    # short: Unix socket paths are limited to 108 bytes
    monkeypatch.setenv("SWARMYARD_STATE_DIR", str(short_tmp / "state"))
    return short_tmp


@pytest.fixture
def plane(folder: Path) -> Iterator[tuple[PlaneListener, int]]:
    listener = plane_listener("run_bridge", "127.0.0.1")
    app = Starlette(routes=[Route("/hello", _hello, methods=["POST"]), Route("/held", _held, methods=["POST"])])
    with BackgroundServer(app, Listen(folder / "plane.sock"), also=(listener.listen(),)) as server:
        port = server.tcp_ports[0]
        assert port is not None
        yield listener, port


def _post(path: Path, body: bytes) -> httpx.Response:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url="http://plane", timeout=30) as http:
        return http.post("/hello", content=body)


def test_the_runs_certificates_are_private_and_its_ca_signs_nothing_more(folder: Path) -> None:
    listener = plane_listener("run_bridge", "127.0.0.1")
    tls = folder / "state" / "runs" / "run_bridge" / FOLDER
    assert sorted(p.name for p in tls.iterdir()) == ["ca.pem", "client.key", "client.pem", "server.key",
                                                      "server.pem"]
    assert {p.stat().st_mode & 0o777 for p in tls.glob("*.key")} == {0o600}
    assert tls.stat().st_mode & 0o777 == 0o700
    first = listener.certs.ca_cert.read_bytes()
    again = plane_listener("run_bridge", "127.0.0.1")  # a resumed run: a new CA, the old one's client refused
    assert again.certs.ca_cert.read_bytes() != first


def test_a_bridge_carries_requests_to_the_plane_over_mutual_tls(folder: Path,
                                                               plane: tuple[PlaneListener, int]) -> None:
    listener, port = plane
    left = set(Path(tempfile.gettempdir()).glob("swarmyard-tls-*"))
    bridge = PlaneBridge(folder / "node" / "plane.sock", listener.for_nodes(port)).start()
    try:
        # the client certificate and key were loaded and their files removed
        assert set(Path(tempfile.gettempdir()).glob("swarmyard-tls-*")) == left
        for n in range(3):
            answer = _post(bridge.path, f"call {n}".encode())
            assert (answer.status_code, answer.content) == (200, f"plane:call {n}".encode())
        assert bridge.forwarded >= 1 and bridge.failed == 0
        assert bridge.path.stat().st_mode & 0o777 == 0o666
        assert bridge.path.parent.stat().st_mode & 0o777 == 0o700
    finally:
        bridge.close()
    assert not bridge.path.exists()


def test_a_bridge_forwards_nothing_to_a_plane_whose_certificate_is_not_of_the_runs_ca(
        folder: Path, plane: tuple[PlaneListener, int]) -> None:
    listener, port = plane
    other = init_certs(folder / "other", ["127.0.0.1"])
    tls = listener.for_nodes(port)
    # the same listener, but the bridge is told to trust another CA: the plane's certificate does not chain to it
    stranger = type(tls)(tls.host, tls.port, other.ca_cert.read_bytes(), other.client_cert.read_bytes(),
                         other.client_key.read_bytes())
    bridge = PlaneBridge(folder / "node" / "plane.sock", stranger).start()
    try:
        with pytest.raises(httpx.HTTPError):
            _post(bridge.path, b"x")
        assert (bridge.forwarded, bridge.failed) == (0, 1)
    finally:
        bridge.close()


def _knock(port: int, ca: Path, cert: tuple[Path, Path] | None) -> bytes:
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(*cert)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
            conn.sendall(b"POST /hello HTTP/1.1\r\nHost: plane\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return conn.recv(12)
    except (ssl.SSLError, OSError):
        return b""


def test_the_tls_listener_refuses_a_client_without_the_runs_certificate(folder: Path,
                                                                       plane: tuple[PlaneListener, int]) -> None:
    listener, port = plane
    other = init_certs(folder / "other", ["127.0.0.1"])
    ca = listener.certs.ca_cert
    assert _knock(port, ca, (listener.certs.client_cert, listener.certs.client_key)).startswith(b"HTTP/1.1 200")
    assert _knock(port, ca, None) == b""
    assert _knock(port, ca, (other.client_cert, other.client_key)) == b""
    # the run's server certificate is no client certificate: its key usage is for serving only
    assert _knock(port, ca, (listener.certs.server_cert, listener.certs.server_key)) == b""


_KILLED_HOST = """
import os, signal, sys
from swarmyard.machines.bridge import PlaneTls
from swarmyard.machines.ray import NodeHost
ca, cert, key = (open(p, "rb").read() for p in sys.argv[3:6])
host = NodeHost(sys.argv[1])
print(host.bridge("dead", PlaneTls("127.0.0.1", int(sys.argv[2]), ca, cert, key))[1], flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # as Ray ends the actors of a driver that died
"""


def test_a_node_host_removes_the_bridges_a_killed_host_left_and_keeps_the_live_ones(
        folder: Path, plane: tuple[PlaneListener, int]) -> None:
    from swarmyard.machines.ray import NodeHost

    listener, port = plane
    root = folder / "node"
    certs = listener.certs
    killed = subprocess.run([sys.executable, "-c", _KILLED_HOST, str(root), str(port), str(certs.ca_cert),
                             str(certs.client_cert), str(certs.client_key)], capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    dead = Path(killed.stdout.decode().strip())
    assert dead == root / "bridges" / "dead" / "plane.sock" and dead.exists()  # left by the kill
    empty = root / "bridges" / "empty"  # what a bridge closed before it removed its own folder left
    empty.mkdir()
    os.utime(empty, (0, 0))
    starting = root / "bridges" / "starting"  # a bridge of another run, not listening yet
    starting.mkdir()
    live = PlaneBridge(root / "bridges" / "live" / "plane.sock", listener.for_nodes(port)).start()
    try:
        host = NodeHost(str(root))  # the next host on this node: another run's, or this one resumed
        try:
            assert sorted(p.name for p in (root / "bridges").iterdir()) == ["live", "starting"]
            assert _post(live.path, b"still").content == b"plane:still"
        finally:
            host.close()
    finally:
        live.close()


def test_a_client_that_half_closes_gets_its_answer_through_the_bridge_as_on_the_planes_socket(
        folder: Path, plane: tuple[PlaneListener, int]) -> None:
    listener, port = plane
    bridge = PlaneBridge(folder / "node" / "plane.sock", listener.for_nodes(port)).start()
    try:
        answers = []
        for path in (folder / "plane.sock", bridge.path):
            with socket.socket(socket.AF_UNIX) as conn:
                conn.settimeout(30)
                conn.connect(str(path))
                conn.sendall(b"POST /hello HTTP/1.1\r\nHost: plane\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
                conn.shutdown(socket.SHUT_WR)  # done sending, as some HTTP clients say it
                answer = b""
                while chunk := conn.recv(4096):
                    answer += chunk
            answers.append((answer.split(b"\r\n")[0], answer.endswith(b"plane:hi")))
        assert answers == [(b"HTTP/1.1 200 OK", True)] * 2
    finally:
        bridge.close()


def test_a_half_closed_connection_waiting_for_its_answer_survives_a_garbage_collection(
        folder: Path, plane: tuple[PlaneListener, int]) -> None:
    # once the client has half-closed, nothing the event loop watches leads to the connection's task: a task kept
    # only by the loop's weak set was collected mid-answer (the client read an empty answer)
    listener, port = plane
    bridge = PlaneBridge(folder / "node" / "plane.sock", listener.for_nodes(port)).start()
    _HELD.clear()
    _RELEASE.clear()
    try:
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(30)
            conn.connect(str(bridge.path))
            conn.sendall(b"POST /held HTTP/1.1\r\nHost: plane\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
            conn.shutdown(socket.SHUT_WR)
            assert _HELD.wait(30)
            gc.collect()
            _RELEASE.set()
            answer = b""
            while chunk := conn.recv(4096):
                answer += chunk
        assert (answer.split(b"\r\n")[0], answer.endswith(b"plane:hi")) == (b"HTTP/1.1 200 OK", True)
    finally:
        _RELEASE.set()
        bridge.close()
