"""A goal's call cap is not taken whole by one claim: a second worker's claimed task gets calls the goal has not
made, or its claim is refused saying why.

A real ``swarmyard serve`` on loopback with the simulated provider mounted; two workers' tokens. The goal caps
calls at 10 and each of its two tasks at 10. Once, the first claim carved its task's 10 calls into its slice, the
goal's whole cap, and the second claim's first call was refused with call_cap_exceeded ("has used all 10 of its
model calls") while the goal had made none. A goal's calls are now allocated to its tasks as they are made, like
its budget: the second task's cap of 10 is refused when it is made (the first holds all 10), and two tasks of 5
each both call, each from its own slice.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rigs.serve import serve
from swarmyard.auth.tokens import TokenAuthority, load_or_create_secret
from swarmyard.clock import SystemClock
from swarmyard.domain import GoalSpec, TaskSpec
from swarmyard.errors import CallCapExceededError
from swarmyard.store import open_store


@pytest.mark.slow
def test_second_claim_can_call_while_the_goal_has_calls_left(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(url)
    goal = store.create_goal(GoalSpec("cap", budget_micro_usd=1_000_000, call_cap=10))
    store.create_task(goal.id, TaskSpec("hoard", budget_micro_usd=100_000, call_cap=10))
    with pytest.raises(CallCapExceededError):  # the goal's 10 calls are the first task's: none left for a cap
        store.create_task(goal.id, TaskSpec("b", budget_micro_usd=100_000, call_cap=10))
    store.cancel_task(store.list_tasks(goal.id)[0].id, "made to show the refusal")  # its 10 calls go back
    for title in ("a", "b"):
        store.create_task(goal.id, TaskSpec(title, budget_micro_usd=400_000, call_cap=5))
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
            sliced = [t for t in store.list_tasks(goal.id) if t.state.value == "claimed"]
            assert len(sliced) == 2 and all(t.envelope.call_cap == 5 for t in sliced)
    finally:
        store.close()
