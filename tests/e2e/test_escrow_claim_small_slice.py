"""A task whose slice cannot afford one model call is refused at claim, over the worker's own door.

A real ``swarmyard serve`` on loopback with the simulated provider mounted; a worker's token; the claim tool.
The claim tool asks the store to refuse a task whose envelope cannot afford the least call the broker can hold
(``claim(min_slice_micro_usd=)``): 402 budget_exceeded, and the task is left as it was (no claim, no slice), rather
than claimed for a worker that learns only at its first model call that nothing fits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rigs.network import free_port
from swarmyard.auth.tokens import TokenAuthority, load_or_create_secret
from swarmyard.clock import SystemClock
from swarmyard.domain import GoalSpec, TaskSpec
from swarmyard.store import open_store


@pytest.mark.slow
def test_claim_tool_refuses_a_slice_too_small_for_one_call(tmp_path: Path) -> None:
    (tmp_path / "providers.toml").write_text('[providers.sim]\nkind = "simulated"\nmodels = ["sim-1"]\n'
                                             '[providers.sim.prices.sim-1]\ninput_usd_per_mtok = "1"\n'
                                             'output_usd_per_mtok = "2"\n')
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(url)
    goal = store.create_goal(GoalSpec("tiny", budget_micro_usd=1_000_000, call_cap=0))
    task = store.create_task(goal.id, TaskSpec("tiny", budget_micro_usd=1))
    token, _ = TokenAuthority(load_or_create_secret(tmp_path / "secret"), store, SystemClock()).issue(
        goal.id, "main", ttl_s=600)
    port = free_port()
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "PYTHONPATH", "VIRTUAL_ENV") if k in os.environ}
    proc = subprocess.Popen(
        [sys.executable, "-m", "swarmyard.cli", "serve", "--store", url, "--no-socket", "--host", "127.0.0.1",
         "--port", str(port), "--secret-file", str(tmp_path / "secret"), "--providers",
         str(tmp_path / "providers.toml"), "--operator-token-file", str(tmp_path / "operator-token")],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"authorization": f"Bearer {token}"},
                          timeout=30) as http:
            deadline = time.monotonic() + 60
            while True:  # readiness poll, bounded
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                assert time.monotonic() < deadline, "serve did not start"
                try:
                    http.get("/metrics")
                    break
                except httpx.TransportError:
                    time.sleep(0.05)
            claimed = http.post("/v1/tools/claim_task", json={})
            assert claimed.status_code == 402, claimed.text
            assert claimed.json()["error"]["code"] == "budget_exceeded"
        assert store.get_task(task.id).state.value == "pending"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        store.close()
