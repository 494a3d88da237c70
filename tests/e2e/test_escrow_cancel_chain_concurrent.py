"""Parent and child tasks cancelled at once, from several operator clients, while their workers delegate: every
cancel is answered (200, or 409 for one that ended meanwhile), none fails with a 500, and the goal gets back every
micro-USD that was not spent.

A real ``swarmyard serve`` on loopback (SQLite and PostgreSQL), the operator's and the workers' doors over HTTP.
A cancel locks its task, then gives its unspent budget up the chain to its nearest live ancestor; it used to return
the task's slice to the goal's row first, so it held the goal's row while it waited for the ancestor's, and a
concurrent cancel (or delegate) of that ancestor, holding the ancestor while it waited for the goal's row, made a
deadlock: PostgreSQL broke it by failing one of them, a 500 to its caller.
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

from rigs.serve import serve

_ROUNDS = 15
_BUDGET = 100_000_000


@pytest.mark.slow
def test_cancelling_a_chain_from_both_ends_at_once_answers_every_call_and_returns_every_micro_usd(
        tmp_path: Path, store_url: str) -> None:
    with serve(tmp_path, store_url) as served:
        base, op_headers = served.base, served.operator_headers
        ops = [httpx.Client(base_url=base, headers=op_headers, timeout=60) for _ in range(4)]
        op = ops[0]
        made = op.post("/v1/operator/goals", json={"objective": "x", "budget_micro_usd": _BUDGET, "call_cap": 0,
                                                   "max_depth": 4})
        assert made.status_code == 201, made.text
        goal_id = made.json()["goal"]["id"]
        answers: list[httpx.Response] = []

        def worker() -> httpx.Client:
            issued = op.post(f"/v1/operator/goals/{goal_id}/workers", json={"group": "main"})
            assert issued.status_code == 201, issued.text
            return httpx.Client(base_url=base, headers={"authorization": f"Bearer {issued.json()['token']}"},
                                timeout=60)

        def claim(client: httpx.Client, task_id: str) -> int:
            claimed = client.post("/v1/tools/claim_task", json={"task_id": task_id})
            assert claimed.status_code == 200 and claimed.json()["task"] is not None, claimed.text
            return int(claimed.json()["fencing_token"])

        def delegate(client: httpx.Client, task_id: str, token: int, budget: int) -> httpx.Response:
            return client.post("/v1/tools/delegate", json={"task_id": task_id, "fencing_token": token,
                                                           "title": "sub", "budget_micro_usd": budget})

        for _ in range(_ROUNDS):
            top = op.post(f"/v1/operator/goals/{goal_id}/tasks", json={"title": "top", "budget_micro_usd": 1_000_000})
            assert top.status_code == 201, top.text
            a = top.json()["task"]["id"]
            wa, wb = worker(), worker()
            ta = claim(wa, a)
            made_b = delegate(wa, a, ta, 400_000)
            assert made_b.status_code == 200, made_b.text
            b = made_b.json()["task"]["id"]
            tb = claim(wb, b)
            leaves = []
            for budget in (100_000, 50_000):
                made_leaf = delegate(wb, b, tb, budget)
                assert made_leaf.status_code == 200, made_leaf.text
                leaves.append(made_leaf.json()["task"]["id"])
            wc = worker()
            claim(wc, leaves[0])  # a claimed leaf: its cancel returns its slice to the goal's row
            barrier = threading.Barrier(6)

            def cancel(client: httpx.Client, task_id: str, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                answers.append(client.post(f"/v1/operator/tasks/{task_id}/cancel", json={"reason": "both ends"}))

            def delegating(client: httpx.Client, task_id: str, token: int,
                           barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                for _ in range(3):
                    answers.append(delegate(client, task_id, token, 10_000))

            threads = [threading.Thread(target=cancel, args=(ops[i], t)) for i, t in enumerate([*leaves, b, a])]
            threads += [threading.Thread(target=delegating, args=(wa, a, ta)),
                        threading.Thread(target=delegating, args=(wb, b, tb))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for client in (wa, wb, wc):
                client.close()

        assert not [(r.request.url.path, r.status_code, r.text) for r in answers if r.status_code >= 500]
        for task in op.get(f"/v1/operator/goals/{goal_id}/tasks").json()["tasks"]:
            if task["state"] in ("pending", "claimed"):  # a sub-task delegated after its parent's cancel
                assert op.post(f"/v1/operator/tasks/{task['id']}/cancel", json={}).status_code == 200
        tasks = op.get(f"/v1/operator/goals/{goal_id}/tasks").json()["tasks"]
        assert {t["state"] for t in tasks} == {"cancelled"}
        assert all(t["envelope"]["limit"] == 0 for t in tasks), tasks  # nothing was spent: all went back
        # the goal's whole budget can be given out again, and not a micro-USD more
        whole = op.post(f"/v1/operator/goals/{goal_id}/tasks", json={"title": "all", "budget_micro_usd": _BUDGET})
        assert whole.status_code == 201, whole.text
        for client in ops:
            client.close()
