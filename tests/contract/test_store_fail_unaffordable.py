"""A task whose envelope cannot afford one model call ends failed, once, with no slice carved, on both engines.

``claim(min_slice_micro_usd=N)`` refuses such a task and leaves it pending; ``fail_unaffordable(goal, N)`` is how
a run ends it: one conditional update per task (still claimable, still short of N), ``task.failed`` with a reason
naming its slice, its unspent budget back where a cancelled task's goes.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from swarmyard.clock import FakeClock
from swarmyard.domain import GoalSpec, TaskSpec, TaskState
from swarmyard.errors import BudgetExceededError, FencingError
from swarmyard.store import open_store


def _events(store: Any, goal_id: str, kind: str) -> list[dict[str, Any]]:
    bodies = [json.loads(e.body) for e in store.unsequenced_events(limit=10_000) if e.kind == kind]
    return [b for b in bodies if b.get("goal") == goal_id]


def _allocated(store: Any, goal_id: str) -> tuple[int, int]:
    with store._e.read() as cur:
        cur.execute("SELECT allocated, escrowed FROM goals WHERE id = ?", (goal_id,))
        allocated, escrowed = cur.fetchone()
    return int(allocated), int(escrowed)


@pytest.fixture
def clocked(store_url: str) -> Any:
    clock = FakeClock()
    store = open_store(store_url, clock=clock)
    yield store, clock
    store.close()


def test_a_refused_task_fails_once_and_the_others_stay_claimable(clocked: Any) -> None:
    store, _ = clocked
    goal = store.create_goal(GoalSpec("g", 10_000, 0)).id
    small = store.create_task(goal, TaskSpec("small", budget_micro_usd=40, priority=5))
    big = store.create_task(goal, TaskSpec("big", budget_micro_usd=5_000))
    other = store.create_goal(GoalSpec("other", 100, 0)).id
    elsewhere = store.create_task(other, TaskSpec("elsewhere", budget_micro_usd=1))
    with pytest.raises(BudgetExceededError):
        store.claim(goal, "w", 60, task_id=small.id, min_slice_micro_usd=100)
    assert store.get_task(small.id).state is TaskState.PENDING  # the refusal itself changes nothing

    [failed] = store.fail_unaffordable(goal, 100)
    assert (failed.id, failed.state) == (small.id, TaskState.FAILED)
    assert failed.result == ("refused at claim: its slice (40 micro-USD) cannot afford one model call "
                             "(100 micro-USD)")
    assert failed.envelope.limit == 0 and failed.fencing_token is None and failed.attempts == 0
    assert store.fail_unaffordable(goal, 100) == []  # exactly once
    [event] = _events(store, goal, "task.failed")
    assert (event["task"], event["needed"], event["returned"]) == (small.id, 100, 40)
    assert not [e for e in _events(store, goal, "task.slice_carved") if e["task"] == small.id]
    assert _allocated(store, goal) == (5_000, 0)  # its 40 went back to the goal's unallocated budget
    assert store.get_task(elsewhere.id).state is TaskState.PENDING  # another goal's task is not touched
    claim = store.claim(goal, "w", 60, min_slice_micro_usd=100)
    assert claim is not None and claim.task.id == big.id


def test_only_the_named_group_and_a_lapsed_claims_slice_goes_back_once(clocked: Any) -> None:
    store, clock = clocked
    goal = store.create_goal(GoalSpec("g", 10_000, 0)).id
    lapsed = store.create_task(goal, TaskSpec("lapsed", group="a", budget_micro_usd=50))
    held = store.claim(goal, "w", 10, task_id=lapsed.id)
    assert held is not None and _allocated(store, goal) == (50, 50)  # its slice is carved
    mine = store.create_task(goal, TaskSpec("mine", group="a", budget_micro_usd=60))
    theirs = store.create_task(goal, TaskSpec("theirs", group="b", budget_micro_usd=60))
    assert [t.id for t in store.fail_unaffordable(goal, 100, group="a")] == [mine.id]  # a live claim is not
    clock.advance(11)
    [failed] = store.fail_unaffordable(goal, 100, group="a")
    assert failed.id == lapsed.id and failed.state is TaskState.FAILED
    assert [e["task"] for e in _events(store, goal, "task.slice_returned")] == [lapsed.id]
    assert _allocated(store, goal) == (60, 0)
    assert store.get_task(theirs.id).state is TaskState.PENDING
    with pytest.raises(FencingError):  # the lapsed claim's token writes nothing any more
        store.fail(lapsed.id, held.token, "late")


def test_a_refused_sub_task_gives_its_budget_to_its_live_parent(clocked: Any) -> None:
    store, _ = clocked
    goal = store.create_goal(GoalSpec("g", 10_000, 0)).id
    parent = store.create_task(goal, TaskSpec("parent", budget_micro_usd=1_000))
    held = store.claim(goal, "w", 60, task_id=parent.id)
    assert held is not None
    child = store.delegate(parent.id, held.token, TaskSpec("child", budget_micro_usd=30))
    assert [t.id for t in store.fail_unaffordable(goal, 100)] == [child.id]
    assert store.get_task(parent.id).envelope.limit == 1_000
    assert _allocated(store, goal) == (1_000, 1_000)  # back in the parent's live slice, escrow with it


def test_two_runs_failing_at_once_fail_each_task_once(store_url: str) -> None:
    """Two processes' stores race over the same tasks: each task ends failed by exactly one of them."""
    setup = open_store(store_url, clock=FakeClock())
    try:
        goal = setup.create_goal(GoalSpec("g", 100_000, 0)).id
        ids = {setup.create_task(goal, TaskSpec(f"t{i}", budget_micro_usd=10)).id for i in range(20)}
    finally:
        setup.close()
    stores = [open_store(store_url, clock=FakeClock()) for _ in range(2)]
    results: list[list[str]] = [[], []]
    start = threading.Barrier(2)

    def fail(i: int) -> None:
        start.wait()
        results[i] = [t.id for t in stores[i].fail_unaffordable(goal, 100)]

    threads = [threading.Thread(target=fail, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert sorted(results[0] + results[1]) == sorted(ids)
        assert sorted(e["task"] for e in _events(stores[0], goal, "task.failed")) == sorted(ids)
        assert _allocated(stores[0], goal) == (0, 0)
    finally:
        for s in stores:
            s.close()
