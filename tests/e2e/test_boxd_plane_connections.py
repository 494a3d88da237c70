"""A Boxd client's embedded plane guards its connections as ``swarmyard serve`` does: every machine can reach the
socket bound into it with no token, so a machine (or a process on the host) that holds connections half-sent, or
sends a header with no end, must not take the client's file descriptors or memory.

Found from outside: 3 processes x 400 half-sent requests from one machine were held for ever, the client process
ran out of file descriptors and every call of its failed with a bare ``OSError`` (EMFILE); a 300 MiB header line
was read whole into the client's memory and answered 200. Here a Boxd script whose open-files limit is 512 makes
and runs machines while a flood on its machines' socket is held at the listener's cap, and a header past 64 KiB
is answered 431 with the rest of it never read.
"""

from __future__ import annotations

import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

_SAFETY_S = 120  # only so a regression fails instead of hanging

_SCRIPT = '''
import resource
import sys
from swarmyard.boxd import Boxd
from swarmyard.errors import SwarmyardError
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))
with Boxd(providers=sys.argv[1], root=sys.argv[2]) as boxd:
    first = boxd.machines.create("first")
    boxd.machines.wait_until_ready(first.id)
    print(boxd._plane_now().socket, flush=True)
    sys.stdin.readline()  # the flood is on
    try:
        second = boxd.machines.create("second")
        boxd.machines.wait_until_ready(second.id)
        for machine in (first.id, second.id):
            print(machine == first.id and "first" or "second", boxd.machines.exec(machine, "echo ran").stdout.strip())
    except SwarmyardError as exc:
        print("typed error:", exc.code, exc.message)
    print("done", flush=True)
'''


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-pc-"))
    (path / "root").mkdir()
    (path / "providers.toml").write_text('[providers.sim]\nkind = "simulated"\nmodels = ["m1"]\n')
    yield path
    shutil.rmtree(path, ignore_errors=True)


class _Flood:
    """``size`` connections to a Unix socket, each with a request line and one header sent and no more; every one
    the server closes is opened again, until ``stop``."""

    def __init__(self, path: str, size: int) -> None:
        self._path, self._size = path, size
        self.closed_by_server = 0
        self._stop = threading.Event()
        self._first_closed = threading.Event()
        self._held: list[socket.socket] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._guarded, daemon=True)

    def _open(self) -> socket.socket | None:
        held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            held.connect(self._path)
            held.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        except (BrokenPipeError, ConnectionResetError, ConnectionRefusedError):  # closed, or the queue was full
            held.close()
            self._gone()
            return None
        return held

    def _gone(self) -> None:
        self.closed_by_server += 1
        self._first_closed.set()

    def _guarded(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # said by start(); once the script has ended its plane is gone
            self.error = exc
            self._first_closed.set()

    def _run(self) -> None:
        poller = select.poll()

        def add() -> None:
            held = self._open()
            if held is not None:
                self._held.append(held)
                poller.register(held, select.POLLIN)

        for _ in range(self._size):
            add()
        while not self._stop.is_set():
            for fd, _ in poller.poll(200):
                gone = next(s for s in self._held if s.fileno() == fd)
                poller.unregister(fd)
                self._held.remove(gone)
                gone.close()
                self._gone()
            self._stop.wait(0.05)  # an attacker's pace, not a wait for anything: 20 refills a second
            for _ in range(self._size - len(self._held)):
                add()

    def start(self) -> None:
        self._thread.start()
        # a closed connection says the server accepted past its cap (or a deadline ran out) and holds no more
        assert self._first_closed.wait(_SAFETY_S), "the plane closed none of the flood's connections"
        assert self.error is None, repr(self.error)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(_SAFETY_S)
        for held in self._held:
            held.close()


def test_a_flood_of_half_sent_connections_leaves_the_client_making_and_running_machines(folder: Path) -> None:
    (folder / "script.py").write_text(_SCRIPT)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    script = subprocess.Popen([sys.executable, "script.py", str(folder / "providers.toml"), str(folder / "root")],
                              cwd=folder, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    assert script.stdin is not None and script.stdout is not None
    flood: _Flood | None = None
    try:
        plane = script.stdout.readline().strip()
        assert plane, script.communicate(timeout=_SAFETY_S)[1][-3000:]
        flood = _Flood(plane, 600)  # more than the script's 512 open files
        flood.start()
        script.stdin.write("go\n")
        script.stdin.flush()
        out, err = script.communicate(timeout=600)
    finally:
        if flood is not None:
            flood.stop()
        script.kill()
    assert script.returncode == 0, err[-3000:]
    assert out.splitlines() == ["first ran", "second ran", "done"], err[-3000:]
    assert flood.closed_by_server >= 600 - 256, flood.closed_by_server  # each listener's cap: (512 - 256) / 2
    assert "Too many open files" not in err, err[-3000:]


_HUGE = '''
import sys
from swarmyard.boxd import Boxd
with Boxd(providers=sys.argv[1], root=sys.argv[2]) as boxd:
    machine = boxd.machines.create("m")
    boxd.machines.wait_until_ready(machine.id)
    print(boxd._plane_now().socket, flush=True)
    sys.stdin.readline()
    print(boxd.machines.exec(machine.id, "echo still").stdout.strip())
'''


def huge_header(path: str) -> tuple[int, bytes]:
    """Send a request whose one header line would run to 64 MiB: how many of its bytes the server let in before
    it closed, and what it answered."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(_SAFETY_S)
        sock.connect(path)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sent, block = 0, b"a" * (1 << 20)
        try:
            while sent < 64 << 20:
                sock.sendall(block)
                sent += len(block)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        with_reset = (ConnectionResetError,)
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except with_reset:
            pass
    return sent, answer


def test_a_header_with_no_end_is_answered_431_and_not_read(folder: Path) -> None:
    (folder / "script.py").write_text(_HUGE)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    script = subprocess.Popen([sys.executable, "script.py", str(folder / "providers.toml"), str(folder / "root")],
                              cwd=folder, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    assert script.stdin is not None and script.stdout is not None
    try:
        plane = script.stdout.readline().strip()
        assert plane, script.communicate(timeout=_SAFETY_S)[1][-3000:]
        sent, answer = huge_header(plane)
        script.stdin.write("go\n")
        script.stdin.flush()
        out, err = script.communicate(timeout=600)
    finally:
        script.kill()
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:300]
    assert b"headers_too_large" in answer
    # the server stopped reading past its cap: the rest met a closed socket, not the client's memory
    assert sent < 8 << 20, sent
    assert script.returncode == 0 and out == "still\n", err[-3000:]
