"""``swarmyard broker serve`` builds its broker from the same table as a run: a call settles at the file's price.

A real broker process on a loopback port in front of a small OpenAI-compatible upstream in the test (standing in
for a paid provider) that reports usage; a real HTTP client with a worker's token; the ledger read back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import claimed_worker
from rigs.network import free_port as _free_port
from rigs.network import http_server
from swarmyard.auth.tokens import load_or_create_secret
from swarmyard.clock import SystemClock
from swarmyard.domain import ReservationState
from swarmyard.store import open_store

PROMPT, COMPLETION = 1000, 500
#: "2" and "8" USD per million tokens: 1,000 x 2 + 500 x 8 micro-USD
COST = 6_000


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        reply = json.dumps({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}],
            "usage": {"prompt_tokens": PROMPT, "completion_tokens": COMPLETION, "total_tokens": PROMPT + COMPLETION},
        }).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


@pytest.fixture
def upstream() -> Iterator[str]:
    with http_server(_Handler) as url:
        yield f"{url}/v1"


@pytest.mark.slow
def test_broker_serve_settles_a_call_at_the_files_price(tmp_path: Path, upstream: str) -> None:
    (tmp_path / "providers.toml").write_text(f"""
[providers.up]
kind = "openai_compatible"
base_url = "{upstream}"
models = ["up-model"]
[providers.up.prices.up-model]
input_usd_per_mtok = "2"
output_usd_per_mtok = "8"
""")
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(url)
    worker = claimed_worker(store, SystemClock(), secret=load_or_create_secret(tmp_path / "token-secret"))
    port = _free_port()
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "PYTHONPATH", "VIRTUAL_ENV") if k in os.environ}
    proc = subprocess.Popen(
        [sys.executable, "-m", "swarmyard.cli", "broker", "serve", "--store", url, "--port", str(port),
         "--secret-file", str(tmp_path / "token-secret"), "--providers", str(tmp_path / "providers.toml")],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}/v1",
                          headers={"authorization": f"Bearer {worker.token}"}, timeout=30) as http:
            deadline = time.monotonic() + 60
            while True:  # readiness poll, bounded
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                assert time.monotonic() < deadline, "broker serve did not start"
                try:
                    models = http.get("/models")
                    break
                except httpx.TransportError:
                    time.sleep(0.05)
            assert [m["id"] for m in models.json()["data"]] == ["up-model"]
            # 1,200 bytes in and room for 500 out: the hold covers what the upstream will report
            answer = http.post("/chat/completions", json={"model": "up-model", "max_tokens": COMPLETION,
                                                          "messages": [{"role": "user", "content": "hello " * 200}]})
            assert answer.status_code == 200, answer.text
        proc.terminate()  # a stopping broker writes its queued settlements first
        assert proc.wait(timeout=30) in (0, 130, -15), proc.stderr.read().decode() if proc.stderr else ""
        [held] = store.list_reservations(worker.goal_id)
        assert (held.state, held.actual, held.input_tokens, held.output_tokens, held.overage) == (
            ReservationState.SETTLED, COST, PROMPT, COMPLETION, 0)
        envelope = store.get_task(worker.task_id).envelope
        assert (envelope.settled, envelope.reserved) == (COST, 0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        store.close()
