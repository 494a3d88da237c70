"""``python -m swarmyard.agents`` ends with one line saying why when its plane is not there or drops its answer:
exit 1, no traceback (a traceback was printed before: the transport's own errors were not swarmyard's)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest


def _agent(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SWARMYARD_TOKEN": "tok", "SWARMYARD_MODEL": "m",
             "SWARMYARD_WORKDIR": str(tmp_path), **env}
    if "PYTHONPATH" in os.environ:
        clean["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run([sys.executable, "-m", "swarmyard.agents"], env=clean, cwd=tmp_path, text=True,
                          capture_output=True, timeout=120, check=False)


@pytest.fixture
def hangs_up() -> Iterator[int]:
    """A loopback port that accepts a connection, reads the request and closes without a word."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    server.close()
    thread.join(timeout=10)


def test_a_missing_plane_socket_is_one_line_and_exit_1(tmp_path: Path) -> None:
    done = _agent(tmp_path, SWARMYARD_PLANE_URL="http://plane", SWARMYARD_PLANE_SOCKET=str(tmp_path / "none.sock"))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("agent error (plane_unreachable): ")
    assert "none.sock" in done.stderr
    assert done.stdout == ""


def test_a_refused_port_is_one_line_and_exit_1(tmp_path: Path) -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    done = _agent(tmp_path, SWARMYARD_PLANE_URL=f"http://127.0.0.1:{port}")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("agent error (plane_unreachable): ")


def test_a_plane_that_hangs_up_is_one_line_and_exit_1(tmp_path: Path, hangs_up: int) -> None:
    done = _agent(tmp_path, SWARMYARD_PLANE_URL=f"http://127.0.0.1:{hangs_up}")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("agent error (plane_connection_lost): ")


DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.fixture
def answers_deep() -> Iterator[int]:
    """A loopback 'plane' answering every request 200 with JSON nested past the parser's stack."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                             + str(len(DEEP)).encode() + b"\r\nconnection: close\r\n\r\n" + DEEP)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    server.close()
    thread.join(timeout=10)


def test_an_answer_nested_past_the_parser_is_bad_response_not_a_traceback(tmp_path: Path, answers_deep: int) -> None:
    done = _agent(tmp_path, SWARMYARD_PLANE_URL=f"http://127.0.0.1:{answers_deep}")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("agent error (bad_response): ")


def test_the_agents_readers_of_model_text_refuse_deep_nesting_with_a_typed_error() -> None:
    from swarmyard.agents.actions import parse_reply, parse_tool_call
    from swarmyard.agents.planner import parse_plan
    from swarmyard.agents.verdicts import read
    from swarmyard.errors import InvalidInputError

    deep = "[" * 100_000 + "]" * 100_000
    for call in (lambda: parse_reply("{" + '"tool": "board_post", "args": ' + deep + "}"),
                 lambda: parse_reply('{"tool": "board_post", "args": "' + deep + '"}'),
                 lambda: parse_tool_call("board_post", deep),
                 lambda: parse_plan(deep, 3),
                 lambda: parse_plan("[1, 2", 3)):
        with pytest.raises(InvalidInputError):
            call()
    assert read('{"verdict": ' + deep + "}", ()) is None
