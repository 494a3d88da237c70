"""``swarmyard serve`` always has the dashboard: on its TCP address the login page without a token, the data with
the operator token, 403 for a worker's; ``--trajectories DIR`` keeps the steps a worker reports; Ctrl-C stops it
(exit 130) even with a dashboard stream open."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from rigs.network import free_port as _free_port


@pytest.fixture
def folder(short_tmp: Path) -> Path:
    # short: Unix socket paths are limited
    return short_tmp


def test_serve_has_the_dashboard_and_keeps_trajectories(folder: Path) -> None:
    port = _free_port()
    token_file, steps = folder / "operator-token", folder / "steps"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    proc = subprocess.Popen([sys.executable, "-m", "swarmyard.cli", "serve", "--socket", str(folder / "p.sock"),
                             "--store", f"sqlite:///{folder / 'store.db'}", "--secret-file", str(folder / "secret"),
                             "--operator-token-file", str(token_file), "--host", "127.0.0.1", "--port", str(port),
                             "--trajectories", str(steps)],
                            cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # it says where it listens once it is about to serve
        assert f"http://127.0.0.1:{port}" in line, line
        base = f"http://127.0.0.1:{port}"
        operator = {"authorization": f"Bearer {token_file.read_text().strip()}"}
        with httpx.Client(base_url=base, timeout=30, transport=httpx.HTTPTransport(retries=20)) as http:
            page = _until_up(http)
            assert page.status_code == 401 and "/ui/login" in page.text
            goal = http.post("/v1/operator/goals", headers=operator,
                             json={"objective": "o", "budget_micro_usd": 1000, "call_cap": 5}).json()["goal"]["id"]
            issued = http.post(f"/v1/operator/goals/{goal}/workers", headers=operator, json={"group": "main"}).json()
            worker = {"authorization": f"Bearer {issued['token']}"}
            assert http.get("/ui/api/goals", headers=worker).status_code == 403
            assert http.get("/ui/api/goals").status_code == 401
            assert [g["id"] for g in http.get("/ui/api/goals", headers=operator).json()["goals"]] == [goal]
            step = {"step": 1, "started_ms": 1, "ended_ms": 2, "result": "ok"}
            assert http.post("/v1/trajectory/steps", headers=worker, json=step).json() == {"kept": True}
            [kept] = steps.glob("*.jsonl")
            assert kept.name == f"{issued['worker']['id']}.jsonl"
            assert json.loads(kept.read_text())["result"] == "ok"
            with http.stream("GET", "/ui/events", params={"goal": goal}, headers=operator) as stream:
                lines = stream.iter_lines()
                assert next(line for line in lines if line.startswith("data: "))
                proc.send_signal(signal.SIGINT)
                list(lines)  # the server ends the stream as it stops
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _until_up(http: httpx.Client) -> httpx.Response:
    """GET /ui once the server answers (the transport retries refused connections)."""
    return http.get("/ui")
