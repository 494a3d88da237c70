"""A task cancelled while one of its model calls is in flight gives back all it did not spend, the unused part of
that call's hold too, once the call settles.

A real ``swarmyard serve`` on loopback (SQLite and PostgreSQL) with a simulated provider that answers slowly; the
operator's and the workers' doors over HTTP. A cancel pins the task's budget to what it has spent and still holds,
so the hold in flight settles inside it; what that hold did not use (its worst case less the call's actual cost)
must then go where the rest of the cancelled task's unspent budget went: to its nearest live ancestor, else to the
goal's unallocated budget. It used to stay in the cancelled task, which can spend nothing, out of the goal for good.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from rigs.serve import serve

_PROVIDERS = ('[providers.sim]\nkind = "simulated"\nmodels = ["sim-1"]\nlatency_s = 3\n'
              '[providers.sim.prices.sim-1]\ninput_usd_per_mtok = "1"\noutput_usd_per_mtok = "2"\n')


def _worker(base: str, op: httpx.Client, goal_id: str) -> httpx.Client:
    issued = op.post(f"/v1/operator/goals/{goal_id}/workers", json={"group": "main"})
    assert issued.status_code == 201, issued.text
    return httpx.Client(base_url=base, headers={"authorization": f"Bearer {issued.json()['token']}"}, timeout=60)


def _claim(worker: httpx.Client, task_id: str) -> int:
    claimed = worker.post("/v1/tools/claim_task", json={"task_id": task_id})
    assert claimed.status_code == 200 and claimed.json()["task"] is not None, claimed.text
    return int(claimed.json()["fencing_token"])


def _cancel_mid_call(op: httpx.Client, worker: httpx.Client, goal_id: str, task_id: str) -> int:
    """Start a model call of the worker's claim, cancel its task once the call's hold is held, let the call end;
    what the call charged."""
    answers: list[httpx.Response] = []
    call = threading.Thread(target=lambda: answers.append(worker.post("/v1/chat/completions", json={
        "model": "sim-1", "max_tokens": 4096, "messages": [{"role": "user", "content": "hello"}]})))
    call.start()
    deadline = time.monotonic() + 60
    while True:  # progress: the hold is taken before the provider is called
        held = op.get(f"/v1/operator/goals/{goal_id}/reservations").json()["reservations"]
        if any(r["task_id"] == task_id and r["state"] == "held" for r in held):
            break
        assert call.is_alive(), answers[0].text if answers else "the call ended before its hold was seen"
        assert time.monotonic() < deadline, "no hold was taken"
        time.sleep(0.02)
    cancelled = op.post(f"/v1/operator/tasks/{task_id}/cancel", json={"reason": "mid-call"})
    assert cancelled.status_code == 200, cancelled.text
    call.join(timeout=120)
    assert not call.is_alive()
    while True:  # progress: a broker may write its settlement after its answer went out
        held = [r for r in op.get(f"/v1/operator/goals/{goal_id}/reservations").json()["reservations"]
                if r["task_id"] == task_id]
        if [r["state"] for r in held] != ["held"]:
            break
        assert time.monotonic() < deadline + 120, "the hold was never settled"
        time.sleep(0.02)
    assert [r["state"] for r in held] == ["settled"], held
    assert 0 < held[0]["actual"] < held[0]["amount"], held  # the hold's worst case was not all used
    return int(held[0]["actual"])


@pytest.mark.slow
def test_a_cancelled_tasks_hold_in_flight_returns_what_it_did_not_use(tmp_path: Path, store_url: str) -> None:
    with serve(tmp_path, store_url, _PROVIDERS) as served, served.client() as op:
        base = served.base
        made = op.post("/v1/operator/goals", json={"objective": "x", "budget_micro_usd": 1_000_000,
                                                   "call_cap": 0, "max_depth": 3})
        assert made.status_code == 201, made.text
        goal_id = made.json()["goal"]["id"]
        top = op.post(f"/v1/operator/goals/{goal_id}/tasks", json={"title": "top", "budget_micro_usd": 200_000})
        assert top.status_code == 201, top.text
        parent_id = top.json()["task"]["id"]
        lead, sub = _worker(base, op, goal_id), _worker(base, op, goal_id)
        token = _claim(lead, parent_id)
        child = lead.post("/v1/tools/delegate", json={"task_id": parent_id, "fencing_token": token,
                                                      "title": "child", "budget_micro_usd": 100_000})
        assert child.status_code == 200, child.text
        child_id = child.json()["task"]["id"]
        _claim(sub, child_id)

        # the child cancelled mid-call: all it did not spend goes to its live parent
        child_spent = _cancel_mid_call(op, sub, goal_id, child_id)
        ended = op.get(f"/v1/operator/tasks/{child_id}").json()["task"]
        assert ended["state"] == "cancelled"
        assert ended["envelope"]["limit"] == ended["envelope"]["settled"] == child_spent, ended
        parent = op.get(f"/v1/operator/tasks/{parent_id}").json()["task"]
        assert parent["envelope"]["limit"] == 200_000 - child_spent, parent

        # the top-level task cancelled mid-call: all it did not spend goes back to the goal's unallocated budget
        top_spent = _cancel_mid_call(op, lead, goal_id, parent_id)
        ended = op.get(f"/v1/operator/tasks/{parent_id}").json()["task"]
        assert ended["envelope"]["limit"] == ended["envelope"]["settled"] == top_spent, ended
        # the goal can give out again everything not spent: a task of exactly that much is made
        rest = op.post(f"/v1/operator/goals/{goal_id}/tasks", json={
            "title": "rest", "budget_micro_usd": 1_000_000 - child_spent - top_spent})
        assert rest.status_code == 201, rest.text
        more = op.post(f"/v1/operator/goals/{goal_id}/tasks", json={"title": "more", "budget_micro_usd": 1})
        assert more.status_code == 402, more.text
        for client in (lead, sub):
            client.close()
