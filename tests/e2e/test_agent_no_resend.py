"""The built-in agent never asks again for a call whose answer was lost after it left.

Through the console script: ``swarmyard run`` on a swarm file whose worker model is served by a loopback
upstream (the only test double: it stands in for a paid provider) that reads the request and drops the
connection without an answer. The broker marks that hold ``unknown`` and answers 502 ``upstream_unknown`` with
``x-should-retry: false``; the agent (which asks again after a failure in passing) must take that as final:
with one try allowed, the upstream sees exactly one worker request, and the store holds exactly one worker
reservation, ``unknown``.
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


class DroppingUpstream:
    """Reads each request whole; a worker's is dropped unanswered, the lead's gets a synthesis."""

    def __init__(self) -> None:
        self.posts: Counter[str] = Counter()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

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
                if body["model"] != "up-lead":
                    # the request arrived whole; the answer never will (RST, not a clean close)
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    return
                answer = json.dumps(self._synthesis()).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                             + str(len(answer)).encode() + b"\r\n\r\n" + answer)

    @staticmethod
    def _synthesis() -> dict[str, Any]:
        args = {"title": "synthesis", "body": "The worker's call was lost and not repeated."}
        return {"id": "chatcmpl-lead", "object": "chat.completion", "created": 0, "model": "up-lead",
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": None,
                    "tool_calls": [{"id": "call_lead", "type": "function",
                                    "function": {"name": "submit_finding", "arguments": json.dumps(args)}}]}}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def upstream() -> Iterator[DroppingUpstream]:
    server = DroppingUpstream()
    yield server
    server.close()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-n-"))  # the plane's socket lives in the run folder: keep it short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_call_lost_after_it_left_is_not_asked_again(short_tmp: Path, upstream: DroppingUpstream) -> None:
    swarm = short_tmp / "swarm.toml"
    swarm.write_text(f"""
[goal]
objective = "Say one thing."
budget_usd = "1"
call_cap = 50
deadline_s = 300
[[tasks.lenses]]
title = "one"
prompt = "Say one thing."
[workers]
count = 1
concurrency = 1
max_steps = 4
max_failures = 1
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
    done = subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm)], cwd=short_tmp, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # one worker request reached the upstream: the agent did not ask again, and the broker did not either
    assert upstream.posts["up-worker"] == 1, upstream.posts
    [run_dir] = (short_tmp / "runs").iterdir()
    with sqlite3.connect(run_dir / "store.db") as db:
        rows = db.execute("SELECT model, state FROM reservations ORDER BY created_at").fetchall()
    worker_rows = [state for model, state in rows if model == "up-worker"]
    assert worker_rows == ["unknown"], rows  # one hold, unknown; no second hold
    [worker_log] = [p.read_text() for p in (run_dir / "agents").glob("worker-0-*.log")]
    assert worker_log.count('chat/completions "HTTP/1.1 502') == 1, worker_log[-2000:]
    assert "asking again" not in worker_log
    # it stopped on that error without a placeholder finding: its one try failed, and so did its task
    assert "stopped on a model error" in worker_log
    with sqlite3.connect(run_dir / "store.db") as db:
        [(state,)] = db.execute("SELECT state FROM tasks WHERE title = 'one'").fetchall()
    assert state == "failed"
