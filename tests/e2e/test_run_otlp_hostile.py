"""``swarmyard run --otlp URL`` against a hostile collector on loopback, through the console script on the
scripted provider (process sandbox: the subject is the exporter, not the machine).

- A collector that answers 200 and then sends its headers a byte a second: the exporter's timeout is per read,
  so the batch was never answered nor failed; the run gave up on it at its end and said '0 spans sent', every
  span lost and none in the fallback file. Now each batch has a deadline past the exporter's retries, and what
  the collector did not take is in ``traces.otlp.jsonl``: every model call's span, the run said so on stderr.
- A collector that answers 200 with an endless body: the exporter read the body into memory (under a 4 GiB
  address-space limit it failed with MemoryError and the spans went to the file, without it the host's memory
  was the limit). Now only the status and headers are read: the spans count as sent, and the run's peak
  memory stays small.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigs.genai_conventions import otlp_json_spans
from rigs.scripted import tool_call
from rigs.swarm_files import scripted_swarm

pytestmark = [pytest.mark.slow]

SWARMYARD = Path(sys.executable).with_name("swarmyard")


def _serve(mode: str) -> Iterator[int]:
    """A collector on loopback that reads each request whole, then answers as ``mode`` says, for ever."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()

    def answer(conn: socket.socket) -> None:
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, body = data.split(b"\r\n\r\n", 1)
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            while len(body) < length:
                body += conn.recv(65536)
            if mode == "slow-headers":
                conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                while not stop.wait(0.5):  # a byte every half second: each read is well inside its timeout
                    conn.sendall(b"a")
            else:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
                chunk = b"%x\r\n" % (1 << 20) + b"x" * (1 << 20) + b"\r\n"
                while not stop.is_set():
                    conn.sendall(chunk)
        except OSError:
            pass
        finally:
            conn.close()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        server.close()


@pytest.fixture(params=["slow-headers", "endless-body"])
def collector(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    for port in _serve(request.param):
        yield request.param, port


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # an endless body must not take the host's memory


def _run_measured(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run ``argv`` to its end and return it with its own peak resident memory in KiB (``wait4``'s figure for this
    child alone: the test process's RUSAGE_CHILDREN is the largest of every child it ever had, earlier tests' too)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err, text=True,
                                   preexec_fn=_limit_memory)
        guard = threading.Timer(300, process.kill)  # a run that hangs is ended (and fails its exit-code check)
        guard.start()
        try:
            _, status, usage = os.wait4(process.pid, 0)
        finally:
            guard.cancel()
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, process.returncode, out.read(), err.read()), usage.ru_maxrss


def test_a_hostile_collector_neither_loses_the_runs_spans_nor_takes_its_memory(
        short_tmp: Path, collector: tuple[str, int]) -> None:
    mode, port = collector
    swarm = scripted_swarm(short_tmp)
    (short_tmp / "conf" / "replies").mkdir()
    (short_tmp / "conf" / "replies" / "answers.json").write_text(json.dumps({
        "scripted-worker": [tool_call("submit_finding", title="market", body="Large.", cite=["1"])],
        "scripted-lead": [tool_call("submit_finding", title="synthesis", body="Go.")]}))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8",
           "XDG_STATE_HOME": str(short_tmp / "state"), "SWARMYARD_STATE_DIR": str(short_tmp / "state")}
    done, peak_kib = _run_measured([str(SWARMYARD), "run", str(swarm), "--sandbox", "process", "--no-witness",
                                    "--otlp", f"http://127.0.0.1:{port}/v1/traces"], short_tmp, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    [run_dir] = (short_tmp / "runs").iterdir()
    db = sqlite3.connect(run_dir / "store.db")
    reservations = {r for (r,) in db.execute("SELECT id FROM reservations")}
    db.close()
    assert len(reservations) == 2
    fallback = run_dir / "traces.otlp.jsonl"
    if mode == "slow-headers":
        spans = otlp_json_spans(fallback)
        assert f"did not take {len(spans)} of the run's {len(spans)} spans; {len(spans)} are in {fallback}" \
            in done.stderr, done.stderr
        assert {s["attrs"].get("swarmyard.reservation_id") for s in spans} >= reservations
        assert len(spans) > len(reservations)  # the run's tree as well as its calls
    else:
        assert "spans sent to" in done.stderr and "did not take" not in done.stderr, done.stderr
        assert not fallback.exists()
        assert peak_kib < 1 << 20, peak_kib  # under 1 GiB: the body was not read
