"""A task whose slice cannot afford one model call is refused at claim, over the worker's own door.

A real ``swarmyard serve`` on loopback with the simulated provider mounted; a worker's token; the claim tool.
The claim tool asks the store to refuse a task whose envelope cannot afford the least call the broker can hold
(``claim(min_slice_micro_usd=)``): 402 budget_exceeded, and the task is left as it was (no claim, no slice), rather
than claimed for a worker that learns only at its first model call that nothing fits.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rigs.serve import serve
from swarmyard.auth.tokens import TokenAuthority, load_or_create_secret
from swarmyard.clock import SystemClock
from swarmyard.domain import GoalSpec, TaskSpec
from swarmyard.store import open_store


@pytest.mark.slow
def test_claim_tool_refuses_a_slice_too_small_for_one_call(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(url)
    goal = store.create_goal(GoalSpec("tiny", budget_micro_usd=1_000_000, call_cap=0))
    task = store.create_task(goal.id, TaskSpec("tiny", budget_micro_usd=1))
    token, _ = TokenAuthority(load_or_create_secret(tmp_path / "secret"), store, SystemClock()).issue(
        goal.id, "main", ttl_s=600)
    try:
        with serve(tmp_path, url) as served, served.client(token, timeout=30) as http:
            claimed = http.post("/v1/tools/claim_task", json={})
            assert claimed.status_code == 402, claimed.text
            assert claimed.json()["error"]["code"] == "budget_exceeded"
        assert store.get_task(task.id).state.value == "pending"
    finally:
        store.close()
