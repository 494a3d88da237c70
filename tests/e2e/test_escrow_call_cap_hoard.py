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

from pathlib import Path

import pytest

from rigs.serve import serve
from swarmyard.auth.tokens import TokenAuthority, load_or_create_secret
from swarmyard.clock import SystemClock
from swarmyard.domain import GoalSpec, TaskSpec
from swarmyard.store import open_store


@pytest.mark.slow
def test_second_claim_can_call_while_the_goal_has_calls_left(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(url)
    goal = store.create_goal(GoalSpec("cap", budget_micro_usd=1_000_000, call_cap=10))
    for title in ("a", "b"):
        store.create_task(goal.id, TaskSpec(title, budget_micro_usd=500_000, call_cap=10))
    tokens = TokenAuthority(load_or_create_secret(tmp_path / "secret"), store, SystemClock())
    first, second = (tokens.issue(goal.id, "main", ttl_s=600)[0] for _ in range(2))
    try:
        with serve(tmp_path, url) as served, served.client(first, timeout=30) as one, \
                served.client(second, timeout=30) as two:
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
        store.close()
