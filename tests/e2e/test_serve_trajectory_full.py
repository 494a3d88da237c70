"""A trajectory file that fills up under ``swarmyard serve --trajectories`` ends with the file-full line, even when
the worker's last step that fit held ``"cut": true`` in its own arguments."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from rigs.network import free_port as _free_port
from swarmyard.plane.trajectory import MAX_FILE_BYTES


@pytest.fixture
def folder(short_tmp: Path) -> Path:
    # short: Unix socket paths are limited
    return short_tmp


def test_a_worker_cannot_hide_the_file_full_line(folder: Path) -> None:
    port, token_file, steps = _free_port(), folder / "operator-token", folder / "steps"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    proc = subprocess.Popen([sys.executable, "-m", "swarmyard.cli", "serve", "--socket", str(folder / "p.sock"),
                             "--store", f"sqlite:///{folder / 'store.db'}", "--secret-file", str(folder / "secret"),
                             "--operator-token-file", str(token_file), "--host", "127.0.0.1", "--port", str(port),
                             "--trajectories", str(steps)],
                            cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                          transport=httpx.HTTPTransport(retries=20)) as http:
            http.get("/healthz")
            operator = {"authorization": f"Bearer {token_file.read_text().strip()}"}
            goal = http.post("/v1/operator/goals", headers=operator,
                             json={"objective": "o", "budget_micro_usd": 1000, "call_cap": 5}).json()["goal"]["id"]
            issued = http.post(f"/v1/operator/goals/{goal}/workers", headers=operator, json={"group": "main"}).json()
            worker = {"authorization": f"Bearer {issued['token']}"}
            path = steps / f"{issued['worker']['id']}.jsonl"
            # the worker's earlier steps, as if appended already: the file is all but full
            first = {"step": 1, "started_ms": 1, "ended_ms": 2, "result": "ok"}
            assert http.post("/v1/trajectory/steps", headers=worker, json=first).json() == {"kept": True}
            with path.open("ab") as f:
                f.write(b"{}\n".rjust(MAX_FILE_BYTES - path.stat().st_size - 400, b" "))
            hiding = {"step": 2, "started_ms": 1, "ended_ms": 2, "action": {"tool": "t", "args": {"cut": True}}}
            assert http.post("/v1/trajectory/steps", headers=worker, json=hiding).json() == {"kept": True}
            big = {"step": 3, "started_ms": 1, "ended_ms": 2, "result": "A" * 1000}
            assert http.post("/v1/trajectory/steps", headers=worker, json=big).json() == {"kept": False}
            assert http.post("/v1/trajectory/steps", headers=worker, json=big).json() == {"kept": False}
        lines = path.read_bytes().splitlines()
        assert json.loads(lines[-2])["step"] == 2
        last = json.loads(lines[-1])
        assert last["cut"] is True and "step" not in last  # written once, after the worker's own line
    finally:
        proc.terminate()
        proc.wait(timeout=60)
