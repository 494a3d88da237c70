"""A worker whose every model call fails is a failed try, not a finished task.

Through the console script, in real bubblewrap machines: ``swarmyard run`` on a swarm file whose worker model
is served by a loopback upstream (the only test double: it stands in for a paid provider) that drops every
worker call unanswered (the broker answers 502 ``upstream_unknown``) or answers each with a 401. The built-in
worker submits no placeholder finding: it exits non-zero saying it stopped on a model error, the coordinator
counts a failed try, the task is failed after ``max_failures`` tries with that error, the report names it, and
the run goes on to its lead and ends.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (scripts/test installs it)"),
]

SYNTHESIS = "No worker could reach its model."


class FailingUpstream:
    """Reads each request whole; a worker's is dropped (``drop``) or answered 401 (``401``), the lead's gets
    a synthesis."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.posts: Counter[str] = Counter()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:  # the socket closes only when its file is closed too
            while True:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = reader.readline()
                    if not line:
                        return
                    head += line
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                body = json.loads(reader.read(length))
                self.posts[body["model"]] += 1
                if body["model"] == "up-lead":
                    self._send(conn, b"200 OK", self._synthesis())
                elif self.mode == "drop":
                    # the request arrived whole; the answer never will (RST, not a clean close)
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    return
                else:
                    self._send(conn, b"401 Unauthorized", {"error": {"message": "Incorrect API key provided",
                                                                     "type": "invalid_request_error",
                                                                     "code": "invalid_api_key"}})

    @staticmethod
    def _send(conn: socket.socket, status: bytes, answer: dict[str, Any]) -> None:
        data = json.dumps(answer).encode()
        conn.sendall(b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\ncontent-length: "
                     + str(len(data)).encode() + b"\r\n\r\n" + data)

    @staticmethod
    def _synthesis() -> dict[str, Any]:
        args = {"title": "synthesis", "body": SYNTHESIS}
        return {"id": "chatcmpl-lead", "object": "chat.completion", "created": 0, "model": "up-lead",
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": None,
                    "tool_calls": [{"id": "call_lead", "type": "function",
                                    "function": {"name": "submit_finding", "arguments": json.dumps(args)}}]}}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-e-"))  # the plane's socket lives in the run folder: keep it short
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize(("mode", "code"), [("drop", "upstream_unknown"), ("401", "provider_error")])
def test_a_worker_whose_every_call_fails_fails_its_task_after_max_failures(short_tmp: Path, mode: str,
                                                                          code: str) -> None:
    upstream = FailingUpstream(mode)
    swarm = short_tmp / "swarm.toml"
    swarm.write_text(f"""
[goal]
objective = "Should a small team build a speech app?"
budget_usd = "1"
call_cap = 50
deadline_s = 300
[[tasks.lenses]]
title = "market"
prompt = "Size the market."
[workers]
count = 1
concurrency = 1
max_steps = 4
max_failures = 2
retry_backoff_s = 0
exec_timeout_s = 120
model = "up-worker"
[lead]
model = "up-lead"
[providers.up]
kind = "openai_compatible"
base_url = "http://127.0.0.1:{upstream.port}/v1"
models = ["up-worker", "up-lead"]
[providers.up.prices.up-worker]
input_usd_per_mtok = "1"
output_usd_per_mtok = "2"
[providers.up.prices.up-lead]
input_usd_per_mtok = "1"
output_usd_per_mtok = "2"
[run]
runs_dir = "{short_tmp / 'runs'}"
sandbox = "local"
""")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8"}
    try:
        done = subprocess.run([str(Path(sys.executable).with_name("swarmyard")), "run", str(swarm)],
                              cwd=short_tmp, env=env, capture_output=True, text=True, timeout=600)
    finally:
        upstream.close()
    assert done.returncode == 0, done.stderr[-3000:]  # the run went on to its lead and ended
    assert done.stdout.strip() == SYNTHESIS
    [run_dir] = (short_tmp / "runs").iterdir()
    with sqlite3.connect(run_dir / "store.db") as db:
        tasks = {title: (state, attempts, result)
                 for title, state, attempts, result in db.execute("SELECT title, state, attempts, result FROM tasks")}
        findings = [title for (title,) in db.execute("SELECT title FROM findings")]
    state, attempts, why = tasks["market"]
    assert (state, attempts) == ("failed", 2), tasks
    assert why is not None and why.startswith("2 tries failed the same way: exit 1:"), why
    assert "stopped on a model error at step 1 of 4, before any work" in why and f"({code})" in why, why
    assert findings == ["synthesis"]  # no placeholder finding from the worker
    assert upstream.posts["up-worker"] >= 2, upstream.posts
    logs = [p.read_text() for p in (run_dir / "agents").glob("worker-0-*.log")]
    assert len(logs) == 2 and all("stopped on a model error" in text for text in logs)
    assert "No result was reached" not in "".join(logs)
    report = (run_dir / "report.md").read_text()
    assert "## Failed tasks" in report and "| market |" in report
    assert "stopped on a model error" in report
