"""Under ``swarmyard serve``, a worker's trajectory steps wake no dashboard stream (each wake rebuilds the goal's
whole state for every open stream); its tool calls do. Counted by ``swarmyard_dashboard_wakes_total`` in
/metrics."""

from __future__ import annotations

import os
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


def _wakes(http: httpx.Client, operator: dict[str, str]) -> float:
    for line in http.get("/metrics", headers=operator).text.splitlines():
        if line.startswith("swarmyard_dashboard_wakes_total "):
            return float(line.split()[1])
    raise AssertionError("no swarmyard_dashboard_wakes_total in /metrics")


def test_trajectory_steps_wake_no_dashboard_stream(folder: Path) -> None:
    port, token_file = _free_port(), folder / "operator-token"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    proc = subprocess.Popen([sys.executable, "-m", "swarmyard.cli", "serve", "--socket", str(folder / "p.sock"),
                             "--store", f"sqlite:///{folder / 'store.db'}", "--secret-file", str(folder / "secret"),
                             "--operator-token-file", str(token_file), "--host", "127.0.0.1", "--port", str(port),
                             "--trajectories", str(folder / "steps")],
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
            before = _wakes(http, operator)
            for n in range(20):
                step = {"step": n, "started_ms": 1, "ended_ms": 2, "cpu_ms": n, "max_rss_kb": 1000}
                assert http.post("/v1/trajectory/steps", headers=worker, json=step).json() == {"kept": True}
            assert _wakes(http, operator) == before
            assert http.post("/v1/tools/claim_task", headers=worker, json={}).status_code == 200
            assert _wakes(http, operator) == before + 1
    finally:
        proc.terminate()
        proc.wait(timeout=60)
