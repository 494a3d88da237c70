"""A task with no model call left is not handed out, over the worker's own door.

A real ``swarmyard serve`` on loopback; a worker's token; the claim tool. A task whose own call cap was used up
(its calls made by an earlier claim, which gave the task back) used to be claimed again: its slice held money it
could not spend until the lease ran out, and the worker learnt at its first model call (429). The claim tool now
skips it for a task that can make a call, and, with none left, answers 402 ``no_calls_left`` naming it (the task
is left as it was: no claim, no slice).
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
def test_claim_tool_skips_then_refuses_a_task_with_no_call_left(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(url)
    goal = store.create_goal(GoalSpec("calls", budget_micro_usd=1_000_000, call_cap=5))
    used = store.create_task(goal.id, TaskSpec("used", budget_micro_usd=100_000, call_cap=2, priority=5))
    fresh = store.create_task(goal.id, TaskSpec("fresh", budget_micro_usd=100_000, call_cap=3))
    earlier = store.claim(goal.id, "earlier", 60, task_id=used.id)
    assert earlier is not None
    for _ in range(2):
        store.reserve(used.id, earlier.token, model="m", amount=1, method="x")
    store.release(used.id, earlier.token)
    token, _ = TokenAuthority(load_or_create_secret(tmp_path / "secret"), store, SystemClock()).issue(
        goal.id, "main", ttl_s=600)
    try:
        with serve(tmp_path, url) as served, served.client(token, timeout=30) as http:
            claimed = http.post("/v1/tools/claim_task", json={})
            assert claimed.status_code == 200, claimed.text
            assert claimed.json()["task"]["id"] == fresh.id  # the used one is first by priority, and skipped
            refused = http.post("/v1/tools/claim_task", json={"task_id": used.id})
            assert refused.status_code == 402, refused.text
            error = refused.json()["error"]
            assert error["code"] == "no_calls_left" and error["retryable"] is False
            assert error["envelope"].startswith(f"task {used.id} ") and error["cap"] == 2
        after = store.get_task(used.id)
        assert after.state.value == "pending" and after.fencing_token == earlier.token
    finally:
        store.close()
