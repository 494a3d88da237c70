"""A cancelled task's unspent budget goes somewhere it can be spent, also down a delegation chain.

Cancel a claimed child first and then its pending grandchild: the grandchild's unspent budget goes "back to its
parent", which is cancelled and can spend nothing, so that money leaves the goal for good (no live task, no
slice and not the goal's unallocated budget holds it).
"""

from __future__ import annotations

from typing import Any

import pytest

from swarmyard.clock import FakeClock
from swarmyard.domain import GoalSpec, TaskSpec, TaskState
from swarmyard.store import open_store


@pytest.mark.xfail(strict=True, reason="budget break (predates escrow): a grandchild cancelled after its cancelled parent returns "
                                       "its unspent budget into the cancelled parent, where nothing can spend it")
def test_unspent_budget_of_a_cancelled_chain_stays_spendable(store_url: str) -> None:
    store: Any = open_store(store_url, clock=FakeClock())
    try:
        goal = store.create_goal(GoalSpec("chain", budget_micro_usd=1_000, call_cap=0))
        root = store.create_task(goal.id, TaskSpec("root", budget_micro_usd=1_000))
        held = store.claim(goal.id, "w-root", 60, task_id=root.id)
        assert held is not None
        child = store.delegate(root.id, held.token, TaskSpec("child", budget_micro_usd=500))
        held = store.claim(goal.id, "w-child", 60, task_id=child.id)
        assert held is not None
        grandchild = store.delegate(child.id, held.token, TaskSpec("grandchild", budget_micro_usd=200))
        store.cancel_task(child.id, "stop")
        store.cancel_task(grandchild.id, "stop")
        tasks = store.list_tasks(goal.id)
        live = {TaskState.PENDING, TaskState.CLAIMED}
        # every ended task's budget is what it spent and still holds; the rest is with live tasks
        stranded = sum(t.envelope.available for t in tasks if t.state not in live)
        spendable = sum(t.envelope.available for t in tasks if t.state in live)
        assert stranded == 0, [(t.title, t.state.value, t.envelope) for t in tasks]
        assert spendable == 1_000
    finally:
        store.close()
