"""A cancelled task's unspent budget goes somewhere it can be spent, also down a delegation chain.

Cancel a claimed child first and then its pending grandchild: the grandchild's unspent budget must not go "back
to its parent", which is cancelled and can spend nothing (that money would leave the goal for good: no live
task, no slice and not the goal's unallocated budget would hold it). It goes to the nearest live ancestor, else
to the goal's unallocated budget.
"""

from __future__ import annotations

from typing import Any

from swarmyard.clock import FakeClock
from swarmyard.domain import GoalSpec, TaskSpec, TaskState
from swarmyard.store import open_store


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


def _goal(store: Any, goal_id: str) -> tuple[int, int, int, int, int]:
    """(budget, allocated, reserved, settled, escrowed) of the goal's row."""
    with store._e.read() as cur:
        cur.execute("SELECT budget, allocated, reserved, settled, escrowed FROM goals WHERE id = ?", (goal_id,))
        budget, allocated, reserved, settled, escrowed = (int(v) for v in cur.fetchone())
    return budget, allocated, reserved, settled, escrowed


def _live_slices(store: Any, goal_id: str) -> int:
    with store._e.read() as cur:
        cur.execute("SELECT COALESCE(SUM(slice), 0) FROM tasks WHERE goal_id = ? AND slice_token IS NOT NULL",
                    (goal_id,))
        return int(cur.fetchone()[0])


def test_a_grandchild_cancelled_under_a_live_root_goes_into_its_live_slice(store_url: str) -> None:
    """The money lands in the live root's envelope and in its live slice, and the goal's escrow follows:
    spent + reserved + live slices stays within the budget, escrowed is the sum of the live slices."""
    store: Any = open_store(store_url, clock=FakeClock())
    try:
        goal = store.create_goal(GoalSpec("chain", budget_micro_usd=1_000, call_cap=0))
        root = store.create_task(goal.id, TaskSpec("root", budget_micro_usd=1_000))
        held_root = store.claim(goal.id, "w-root", 60, task_id=root.id)
        child = store.delegate(root.id, held_root.token, TaskSpec("child", budget_micro_usd=500))
        held = store.claim(goal.id, "w-child", 60, task_id=child.id)
        grandchild = store.delegate(child.id, held.token, TaskSpec("grandchild", budget_micro_usd=200))
        store.cancel_task(child.id, "stop")
        before = _goal(store, goal.id)
        store.cancel_task(grandchild.id, "stop")
        budget, allocated, reserved, settled, escrowed = _goal(store, goal.id)
        assert escrowed == before[4] + 200 == _live_slices(store, goal.id)
        assert settled + reserved + escrowed <= budget and allocated == 1_000
        # the root can spend it: a sub-task of the whole 1,000 fits in its slice now
        assert store.delegate(root.id, held_root.token, TaskSpec("all", budget_micro_usd=1_000)).envelope.limit == 1_000
    finally:
        store.close()


def test_a_cancelled_chain_with_no_live_ancestor_returns_to_the_goal(store_url: str) -> None:
    """Root done, child cancelled: the pending grandchild's budget, cancelled, goes back to the goal's unallocated
    budget (a new top-level task can take it), not into the ended root or child; so did the root's unspent budget
    when it was done."""
    store: Any = open_store(store_url, clock=FakeClock())
    try:
        goal = store.create_goal(GoalSpec("chain", budget_micro_usd=1_000, call_cap=0))
        root = store.create_task(goal.id, TaskSpec("root", budget_micro_usd=1_000))
        held_root = store.claim(goal.id, "w-root", 60, task_id=root.id)
        child = store.delegate(root.id, held_root.token, TaskSpec("child", budget_micro_usd=500))
        held = store.claim(goal.id, "w-child", 60, task_id=child.id)
        grandchild = store.delegate(child.id, held.token, TaskSpec("grandchild", budget_micro_usd=200))
        store.cancel_task(child.id, "stop")  # 300 to the live root
        store.complete(root.id, held_root.token, "done")
        cancelled = store.cancel_task(grandchild.id, "stop")
        assert cancelled.envelope.limit == 0
        budget, allocated, reserved, settled, escrowed = _goal(store, goal.id)
        assert allocated == 0 and escrowed == _live_slices(store, goal.id) == 0
        assert settled + reserved + escrowed <= budget
        assert sum(t.envelope.limit for t in store.list_tasks(goal.id)) == allocated
        assert store.create_task(goal.id, TaskSpec("again", budget_micro_usd=1_000)).envelope.limit == 1_000
    finally:
        store.close()
