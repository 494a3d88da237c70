"""A goal's call cap is not taken whole by one claim: a second worker's claimed task gets calls the goal has not
made, or its claim is refused saying why.

A real ``swarmyard serve`` on loopback with the simulated provider mounted; two workers' tokens. The goal caps
calls at 10 and each of its two tasks at 10 (task caps are not carved from the goal's, so they may add up to
more). The first claim carves its task's 10 calls into its slice, the goal's whole cap; the second claim is
granted, and its first call is refused with call_cap_exceeded ("has used all 10 of its model calls") while the
goal had made none. Before escrow the two tasks shared the goal's cap first come, first served, and they do
again: a goal that caps calls gives no slices.
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
def test_second_claim_can_call_while_the_goal_has_calls_left(tmp_path: Path) -> None:
    (tmp_path / "providers.toml").write_text('[providers.sim]\nkind = "simulated"\nmodels = ["sim-1"]\n'
                                             '[providers.sim.prices.sim-1]\ninput_usd_per_mtok = "1"\n'
                                             'output_usd_per_mtok = "2"\n')
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(url)
    goal = store.create_goal(GoalSpec("cap", budget_micro_usd=1_000_000, call_cap=10))
    for title in ("a", "b"):
        store.create_task(goal.id, TaskSpec(title, budget_micro_usd=500_000, call_cap=10))
    tokens = TokenAuthority(load_or_create_secret(tmp_path / "secret"), store, SystemClock())
    first, second = (tokens.issue(goal.id, "main", ttl_s=600)[0] for _ in range(2))
    port = free_port()
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "PYTHONPATH", "VIRTUAL_ENV") if k in os.environ}
    proc = subprocess.Popen(
        [sys.executable, "-m", "swarmyard.cli", "serve", "--store", url, "--no-socket", "--host", "127.0.0.1",
         "--port", str(port), "--secret-file", str(tmp_path / "secret"), "--providers",
         str(tmp_path / "providers.toml"), "--operator-token-file", str(tmp_path / "operator-token")],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, headers={"authorization": f"Bearer {first}"}, timeout=30) as one, \
                httpx.Client(base_url=base, headers={"authorization": f"Bearer {second}"}, timeout=30) as two:
            deadline = time.monotonic() + 60
            while True:  # readiness poll, bounded
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                assert time.monotonic() < deadline, "serve did not start"
                try:
                    one.get("/metrics")
                    break
                except httpx.TransportError:
                    time.sleep(0.05)
            claimed = one.post("/v1/tools/claim_task", json={})
            assert claimed.status_code == 200 and claimed.json()["task"] is not None, claimed.text
            claimed = two.post("/v1/tools/claim_task", json={})
            if claimed.status_code != 200:  # refused at claim, saying why: also keeps the guarantee
                assert claimed.json()["error"]["code"] in ("call_cap_exceeded", "budget_exceeded"), claimed.text
                return
            assert claimed.json()["task"] is not None, claimed.text
            answer = two.post("/v1/chat/completions", json={"model": "sim-1", "max_tokens": 10,
                                                            "messages": [{"role": "user", "content": "hi"}]})
            assert store.get_goal(goal.id).envelope.calls <= 1
            assert answer.status_code == 200, answer.text
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        store.close()
