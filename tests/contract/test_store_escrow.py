"""Escrow, on both engines: a claim carves its task's slice from the goal's envelope, a hold inside it touches
only the task's row, and the claim's end (done, failed, released, cancelled, lease expired, holder crashed)
returns what it did not settle, exactly once.

The invariant everywhere: the goal's spent + reserved + the sum of its live slices <= its budget, the goal's
``escrowed`` is that sum, each live slice's holds are what it counts, and ``get_goal`` reads as it did before
escrow (held, spent and called summed over the goal's row and its live slices, as plain ints on both engines).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from swarmyard.clock import FakeClock
from swarmyard.domain import GoalSpec, ReservationState, TaskSpec, TaskState
from swarmyard.errors import (
    BudgetExceededError,
    CallCapExceededError,
    DepthExceededError,
    FencingError,
    IllegalTransitionError,
    NoCallsLeftError,
)
from swarmyard.store import SqlStore, open_store, rows
from swarmyard.store import sql as store_sql
from swarmyard.store.schema import MIGRATIONS


def _rows(store: SqlStore, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with store._e.read() as cur:
        cur.execute(sql, params)
        return [tuple(r) for r in cur.fetchall()]


def _goal_row(store: SqlStore, goal_id: str) -> dict[str, int]:
    [row] = _rows(store, "SELECT budget, reserved, settled, calls, escrowed, escrowed_calls, call_cap, allocated, "
                         "allocated_calls FROM goals WHERE id = ?", (goal_id,))
    return dict(zip(("budget", "reserved", "settled", "calls", "escrowed", "escrowed_calls", "call_cap",
                     "allocated", "allocated_calls"), (int(v) for v in row), strict=True))


def _slice(store: SqlStore, task_id: str) -> dict[str, Any]:
    [row] = _rows(store, "SELECT slice_token, slice, slice_call_cap, slice_reserved, slice_settled, slice_calls "
                         "FROM tasks WHERE id = ?", (task_id,))
    return dict(zip(("token", "slice", "call_cap", "reserved", "settled", "calls"), row, strict=True))


def _slice_events(store: SqlStore, goal_id: str) -> tuple[Counter[tuple[str, int]], Counter[tuple[str, int]]]:
    carved: Counter[tuple[str, int]] = Counter()
    returned: Counter[tuple[str, int]] = Counter()
    for event in store.unsequenced_events(limit=10_000):
        body = json.loads(event.body)
        if body.get("goal") != goal_id:
            continue
        if event.kind == "task.slice_carved":
            carved[(body["task"], body["slice_token"])] += 1
        elif event.kind == "task.slice_returned":
            returned[(body["task"], body["slice_token"])] += 1
    return carved, returned


def check_escrow_binds(store: SqlStore, goal_id: str) -> None:
    """The budget binds with escrow, the goal reads as before, every slice is returned at most once."""
    goal = _goal_row(store, goal_id)
    live = _rows(store, "SELECT id, slice_token, slice, slice_call_cap, slice_reserved, slice_settled, slice_calls "
                        "FROM tasks WHERE goal_id = ? AND slice_token IS NOT NULL", (goal_id,))
    assert goal["escrowed"] == sum(int(r[2]) for r in live)
    assert goal["escrowed_calls"] == sum(int(r[3]) for r in live)
    assert goal["settled"] + goal["reserved"] + goal["escrowed"] <= goal["budget"]
    assert min(goal["settled"], goal["reserved"], goal["escrowed"]) >= 0
    tasks = _rows(store, "SELECT budget, call_cap, calls FROM tasks WHERE goal_id = ?", (goal_id,))
    assert goal["allocated"] == sum(int(t[0]) for t in tasks) <= goal["budget"], "budget allocated twice or lost"
    if goal["call_cap"]:
        assert goal["calls"] + goal["escrowed_calls"] <= goal["call_cap"]
        # a goal's calls are allocated: its tasks' own caps (an ended task's: the calls it made), and the calls of
        # those with none; what its row counts and its slices carry is within that
        assert goal["allocated_calls"] == sum(int(cap) or int(calls) for _, cap, calls in tasks), (
            "calls allocated twice or lost")
        assert goal["calls"] + goal["escrowed_calls"] <= goal["allocated_calls"] <= goal["call_cap"]
        assert all(int(calls) <= int(cap) for _, cap, calls in tasks if int(cap))
    for _, _, amount, cap, s_reserved, s_settled, s_calls in live:
        assert int(s_reserved) >= 0 and int(s_settled) >= 0 and int(s_reserved) + int(s_settled) <= int(amount)
        if goal["call_cap"]:
            assert int(s_calls) <= int(cap)
    # get_goal as before escrow: every hold of the goal, wherever it is charged
    envelope = store.get_goal(goal_id).envelope
    holds = store.list_reservations(goal_id)
    held = sum(r.amount for r in holds if r.state in (ReservationState.HELD, ReservationState.UNKNOWN))
    spent = sum(min(r.actual or 0, r.amount) for r in holds if r.state is ReservationState.SETTLED)
    assert (envelope.reserved, envelope.settled, envelope.calls) == (held, spent, len(holds))
    assert all(type(v) is int for v in (envelope.reserved, envelope.settled, envelope.calls))
    assert envelope.reserved + envelope.settled <= envelope.limit
    carved, returned = _slice_events(store, goal_id)
    assert set(carved.values()) <= {1} and set(returned.values()) <= {1}, "a slice carved or returned twice"
    assert set(carved) - set(returned) == {(str(r[0]), int(r[1])) for r in live}


# -- examples ------------------------------------------------------------------------------------------------


@pytest.fixture
def escrow_store(store_url: str) -> Any:
    clock = FakeClock()
    store = open_store(store_url, clock=clock)
    yield store, clock
    store.close()


def test_a_claim_carves_the_slice_and_a_hold_touches_only_the_task(escrow_store: Any) -> None:
    store, _ = escrow_store
    goal = store.create_goal(GoalSpec("g", 100_000, 0)).id
    task = store.create_task(goal, TaskSpec("t", budget_micro_usd=30_000)).id
    claim = store.claim(goal, "w", 60)
    assert claim is not None
    assert _goal_row(store, goal)["escrowed"] == 30_000
    assert _slice(store, task)["token"] == claim.token
    before = _goal_row(store, goal)
    hold = store.reserve(task, claim.token, model="m", amount=1_000, method="x")
    assert _goal_row(store, goal) == before, "a hold inside a slice wrote the goal's row"
    assert store.get_goal(goal).envelope.reserved == 1_000 and store.get_goal(goal).envelope.calls == 1
    store.settle(hold.id, 400)
    assert _goal_row(store, goal) == before, "a settlement inside a slice wrote the goal's row"
    assert store.get_goal(goal).envelope.settled == 400 and store.get_goal(goal).envelope.reserved == 0
    store.complete(task, claim.token, "ok")
    after = _goal_row(store, goal)
    assert (after["escrowed"], after["settled"], after["reserved"], after["calls"]) == (0, 400, 0, 1)
    assert store.get_goal(goal).envelope.settled == 400
    check_escrow_binds(store, goal)


def test_a_hold_open_at_the_claims_end_settles_on_the_goal_once(escrow_store: Any) -> None:
    store, clock = escrow_store
    goal = store.create_goal(GoalSpec("g", 100_000, 0)).id
    task = store.create_task(goal, TaskSpec("t", budget_micro_usd=10_000)).id
    claim = store.claim(goal, "w", 60)
    assert claim is not None
    hold = store.reserve(task, claim.token, model="m", amount=3_000, method="x")
    lost = store.reserve(task, claim.token, model="m", amount=2_000, method="x")
    store.mark_unknown(lost.id)
    clock.advance(61)  # the lease expires with both holds open
    assert store.return_ended_slices() == [task]
    assert store.return_ended_slices() == [], "a slice was returned twice"
    row = _goal_row(store, goal)
    assert (row["escrowed"], row["reserved"]) == (0, 5_000)
    store.settle(hold.id, 1_000)  # the late settlement lands on the goal's row now
    store.reconcile(lost.id, None)
    row = _goal_row(store, goal)
    assert (row["reserved"], row["settled"]) == (0, 1_000)
    assert _rows(store, "SELECT reserved, settled FROM tasks WHERE id = ?", (task,)) == [(0, 1_000)]
    check_escrow_binds(store, goal)


def test_a_reclaim_after_expiry_returns_the_old_slice_and_carves_a_new_one(escrow_store: Any) -> None:
    store, clock = escrow_store
    goal = store.create_goal(GoalSpec("g", 100_000, 0)).id
    task = store.create_task(goal, TaskSpec("t", budget_micro_usd=10_000)).id
    first = store.claim(goal, "w1", 10)
    assert first is not None
    store.settle(store.reserve(task, first.token, model="m", amount=2_000, method="x").id, 2_000)
    clock.advance(11)
    second = store.claim(goal, "w2", 10)
    assert second is not None and second.task.id == task
    assert _slice(store, task)["token"] == second.token and _slice(store, task)["slice"] == 8_000
    assert _goal_row(store, goal)["escrowed"] == 8_000 and _goal_row(store, goal)["settled"] == 2_000
    with pytest.raises(FencingError):
        store.reserve(task, first.token, model="m", amount=1, method="x")
    check_escrow_binds(store, goal)


def test_a_slice_too_small_for_one_call_is_refused_at_claim(escrow_store: Any) -> None:
    store, _ = escrow_store
    goal = store.create_goal(GoalSpec("g", 100_000, 0)).id
    small = store.create_task(goal, TaskSpec("small", budget_micro_usd=500, priority=5)).id
    with pytest.raises(BudgetExceededError) as refused:
        store.claim(goal, "w", 60, min_slice_micro_usd=1_000)
    assert (refused.value.needed, refused.value.available) == (1_000, 500) and small in refused.value.envelope
    assert store.get_task(small).state is TaskState.PENDING, "the refused claim was made"
    with pytest.raises(BudgetExceededError):
        store.claim(goal, "w", 60, task_id=small, min_slice_micro_usd=1_000)
    big = store.create_task(goal, TaskSpec("big", budget_micro_usd=5_000)).id
    claim = store.claim(goal, "w", 60, min_slice_micro_usd=1_000)  # the one that can afford a call
    assert claim is not None and claim.task.id == big
    assert store.claim(goal, "w", 60, min_slice_micro_usd=0) is not None  # no minimum: the small one
    check_escrow_binds(store, goal)


def test_a_claim_that_finds_the_affordable_task_locked_by_another_claim_is_nothing_claimable(
        escrow_store: Any, store_url: str) -> None:
    # PostgreSQL's pick skips a row another claim holds locked; the refusal that followed re-read the tasks
    # without asking whether they could afford a call, and answered a non-retryable 402 for a task that could
    # (an attack: 4 of 90 racing claims). Here the other claim is a session holding the row.
    store, _ = escrow_store
    goal = store.create_goal(GoalSpec("g", 100_000, 0)).id
    task = store.create_task(goal, TaskSpec("t", budget_micro_usd=100_000)).id
    if not store_url.startswith("postgresql"):
        assert store.claim(goal, "w", 60, min_slice_micro_usd=18) is not None
        return
    import psycopg

    with psycopg.connect(store_url) as other:
        other.execute("SELECT 1 FROM tasks WHERE id = %s FOR UPDATE", (task,))
        assert store.claim(goal, "w", 60, min_slice_micro_usd=18) is None
    assert store.claim(goal, "w", 60, min_slice_micro_usd=18) is not None
    check_escrow_binds(store, goal)


def test_a_delegated_task_carves_from_its_parents_slice(escrow_store: Any) -> None:
    store, _ = escrow_store
    goal = store.create_goal(GoalSpec("g", 100_000, 0)).id
    parent = store.create_task(goal, TaskSpec("p", budget_micro_usd=10_000)).id
    claim = store.claim(goal, "w", 60)
    assert claim is not None
    store.reserve(parent, claim.token, model="m", amount=7_000, method="x")
    with pytest.raises(BudgetExceededError):
        store.delegate(parent, claim.token, TaskSpec("c", budget_micro_usd=4_000))
    child = store.delegate(parent, claim.token, TaskSpec("c", budget_micro_usd=3_000)).id
    assert _slice(store, parent)["slice"] == 7_000 and _goal_row(store, goal)["escrowed"] == 7_000
    child_claim = store.claim(goal, "w2", 60, task_id=child)
    assert child_claim is not None and _goal_row(store, goal)["escrowed"] == 10_000
    check_escrow_binds(store, goal)
    store.cancel_task(child, "not needed")  # its unspent 3,000 goes back into the parent's live slice
    assert _slice(store, parent)["slice"] == 10_000 and _goal_row(store, goal)["escrowed"] == 10_000
    store.reserve(parent, claim.token, model="m", amount=3_000, method="x")
    check_escrow_binds(store, goal)


def test_a_goal_call_cap_is_allocated_to_its_tasks_and_carved_at_claim(escrow_store: Any) -> None:
    # a goal that caps calls allocates them to its tasks as they are made: a claim carves the calls its task's own
    # cap has left, which no peer could make, so a hold inside the slice writes only the task's row
    store, _ = escrow_store
    goal = store.create_goal(GoalSpec("g", 100_000, 10)).id
    a = store.create_task(goal, TaskSpec("a", budget_micro_usd=1_000, call_cap=4, priority=3)).id
    b = store.create_task(goal, TaskSpec("b", budget_micro_usd=1_000, call_cap=4, priority=2)).id
    with pytest.raises(CallCapExceededError) as refused:  # 2 calls are left unallocated, 3 asked
        store.create_task(goal, TaskSpec("d", budget_micro_usd=1_000, call_cap=3))
    assert "2 calls left" in str(refused.value) and refused.value.asked == 3
    assert "has used all" not in str(refused.value)  # none was used: the message says what was asked
    pooled = store.create_task(goal, TaskSpec("c", budget_micro_usd=1_000, priority=1)).id  # no cap of its own
    assert _goal_row(store, goal)["allocated_calls"] == 8
    ca, cb, cc = (store.claim(goal, w, 60) for w in ("wa", "wb", "wc"))
    assert ca is not None and cb is not None and cc is not None
    assert (ca.task.id, cb.task.id, cc.task.id) == (a, b, pooled)
    assert _slice(store, a)["call_cap"] == 4 and _slice(store, b)["call_cap"] == 4
    assert _slice(store, pooled)["token"] is None, "a task with no cap of its own got a slice of a capped goal"
    assert _goal_row(store, goal)["escrowed_calls"] == 8
    before = _goal_row(store, goal)
    for _ in range(4):  # the whole of a's cap, on a's row only
        store.reserve(a, ca.token, model="m", amount=1, method="x")
    assert _goal_row(store, goal) == before, "a hold inside a slice with calls wrote the goal's row"
    with pytest.raises(CallCapExceededError):
        store.reserve(a, ca.token, model="m", amount=1, method="x")
    for _ in range(2):  # the task with no cap of its own takes the 2 unallocated calls, on the goal's row
        store.reserve(pooled, cc.token, model="m", amount=1, method="x")
    with pytest.raises(CallCapExceededError):
        store.reserve(pooled, cc.token, model="m", amount=1, method="x")
    for _ in range(4):  # b was not starved by either
        store.reserve(b, cb.token, model="m", amount=1, method="x")
    with pytest.raises(CallCapExceededError):
        store.reserve(b, cb.token, model="m", amount=1, method="x")
    assert store.get_goal(goal).envelope.calls == 10
    check_escrow_binds(store, goal)
    for task, claim in ((a, ca), (b, cb), (pooled, cc)):
        store.complete(task, claim.token)
    assert _goal_row(store, goal)["calls"] == 10 and _goal_row(store, goal)["escrowed_calls"] == 0
    check_escrow_binds(store, goal)


def test_a_task_with_no_call_left_is_skipped_at_claim_and_named_when_nothing_else_is(escrow_store: Any) -> None:
    # a claim used to hand out a task whose own cap was used up: its slice held money it could not spend until the
    # lease ran out, and its worker learnt at its first model call (429)
    store, _ = escrow_store
    goal = store.create_goal(GoalSpec("g", 100_000, 10)).id
    used = store.create_task(goal, TaskSpec("used", budget_micro_usd=1_000, call_cap=2, priority=5)).id
    other = store.create_task(goal, TaskSpec("other", budget_micro_usd=1_000, call_cap=3)).id
    first = store.claim(goal, "w", 60, calls=True)
    assert first is not None and first.task.id == used
    for _ in range(2):
        store.reserve(used, first.token, model="m", amount=1, method="x")
    store.release(used, first.token)
    claim = store.claim(goal, "w2", 60, calls=True)  # the used one is first by priority, and skipped
    assert claim is not None and claim.task.id == other
    before = _rows(store, "SELECT id, fencing_token, slice_token FROM tasks WHERE goal_id = ? ORDER BY id", (goal,))
    with pytest.raises(NoCallsLeftError) as refused:
        store.claim(goal, "w3", 60, calls=True)
    assert isinstance(refused.value, BudgetExceededError) and refused.value.status == 402
    assert refused.value.envelope.startswith(f"task {used} ") and refused.value.cap == 2
    assert refused.value.goal_id is None and "all 2 of its own model calls were made" in str(refused.value)
    with pytest.raises(NoCallsLeftError):  # named, and by one that names the least call's price
        store.claim(goal, "w3", 60, task_id=used, min_slice_micro_usd=1)
    assert _rows(store, "SELECT id, fencing_token, slice_token FROM tasks WHERE goal_id = ? ORDER BY id",
                 (goal,)) == before, "a refused claim was made"
    # a claimer that makes no call (one that claims a task to end it) still gets it
    ending = store.claim(goal, "coordinator", 60, task_id=used)
    assert ending is not None
    store.fail(used, ending.token, "no calls left")
    check_escrow_binds(store, goal)


def test_a_task_with_no_cap_of_its_own_is_claimable_while_its_goal_has_calls(escrow_store: Any) -> None:
    # a task with no cap of its own on a capped goal takes its calls from the goal's unallocated ones: with none
    # left it is not handed out; a live peer's unused calls come back when it ends, so it is not failed until no
    # live task holds any, and then it is, once, with the reason
    store, _ = escrow_store
    goal = store.create_goal(GoalSpec("g", 100_000, 4)).id
    capped = store.create_task(goal, TaskSpec("capped", budget_micro_usd=1_000, call_cap=2)).id
    pooled = store.create_task(goal, TaskSpec("pooled", budget_micro_usd=1_000, priority=5)).id
    claim = store.claim(goal, "w", 60, calls=True)
    assert claim is not None and claim.task.id == pooled
    for _ in range(2):  # the goal's 2 unallocated calls
        store.reserve(pooled, claim.token, model="m", amount=1, method="x")
    store.release(pooled, claim.token)
    peer = store.claim(goal, "w2", 60, calls=True)
    assert peer is not None and peer.task.id == capped
    with pytest.raises(NoCallsLeftError) as refused:
        store.claim(goal, "w3", 60, calls=True)
    assert refused.value.goal_id == goal and refused.value.cap == 4 and pooled in refused.value.envelope
    assert store.fail_unaffordable(goal, 0) == [], "failed while a live peer held calls it may give back"
    store.complete(capped, peer.token, "done with no call")  # its 2 calls go back to the goal
    again = store.claim(goal, "w3", 60, calls=True)
    assert again is not None and again.task.id == pooled
    for _ in range(2):
        store.reserve(pooled, again.token, model="m", amount=1, method="x")
    store.release(pooled, again.token)
    with pytest.raises(NoCallsLeftError):
        store.claim(goal, "w4", 60, calls=True)
    [failed] = store.fail_unaffordable(goal, 0)
    assert failed.id == pooled and failed.state is TaskState.FAILED
    assert "no model call left" in (failed.result or "") and "cap of 4 calls" in (failed.result or "")
    assert store.fail_unaffordable(goal, 0) == [] and store.claim(goal, "w4", 60, calls=True) is None
    check_escrow_binds(store, goal)


def test_an_ended_tasks_unspent_budget_and_calls_are_given_out_again(escrow_store: Any) -> None:
    store, _ = escrow_store
    goal = store.create_goal(GoalSpec("g", 10_000, 6)).id
    first = store.create_task(goal, TaskSpec("first", budget_micro_usd=8_000, call_cap=5)).id
    with pytest.raises(BudgetExceededError):
        store.create_task(goal, TaskSpec("later", budget_micro_usd=9_000, call_cap=5))
    claim = store.claim(goal, "w", 60)
    assert claim is not None
    store.settle(store.reserve(first, claim.token, model="m", amount=2_000, method="x").id, 1_500)
    done = store.complete(first, claim.token, "ok")
    # its budget is what it spent, its cap the calls it made: the rest is the goal's to give out again
    assert (done.envelope.limit, done.envelope.call_cap) == (1_500, 1)
    row = _goal_row(store, goal)
    assert (row["allocated"], row["allocated_calls"], row["settled"], row["escrowed"]) == (1_500, 1, 1_500, 0)
    returned = [json.loads(e.body) for e in store.unsequenced_events(limit=1_000) if e.kind == "task.completed"]
    assert [(e["returned"], e["returned_calls"], e["returned_to"]) for e in returned] == [(6_500, 4, None)]
    later = store.create_task(goal, TaskSpec("later", budget_micro_usd=8_500, call_cap=5)).id
    again = store.claim(goal, "w", 60)
    assert again is not None and again.task.id == later
    assert _slice(store, later)["slice"] == 8_500 and _slice(store, later)["call_cap"] == 5
    with pytest.raises(IllegalTransitionError):  # once: the ended task gives nothing back a second time
        store.cancel_task(first, "again")
    with pytest.raises(BudgetExceededError):
        store.create_task(goal, TaskSpec("more", budget_micro_usd=1))
    store.fail(later, again.token, "no")
    assert _goal_row(store, goal)["allocated"] == 1_500 and _goal_row(store, goal)["allocated_calls"] == 1
    check_escrow_binds(store, goal)


def test_a_delegated_task_carves_its_calls_from_its_parents_and_gives_back_what_it_did_not_use(
        escrow_store: Any) -> None:
    store, _ = escrow_store
    goal = store.create_goal(GoalSpec("g", 100_000, 8, max_depth=2)).id
    parent = store.create_task(goal, TaskSpec("p", budget_micro_usd=10_000, call_cap=5)).id
    claim = store.claim(goal, "w", 60)
    assert claim is not None and _slice(store, parent)["call_cap"] == 5
    with pytest.raises(CallCapExceededError):  # all 5 of a parent that made none: it keeps one
        store.delegate(parent, claim.token, TaskSpec("c", budget_micro_usd=1_000, call_cap=5))
    child = store.delegate(parent, claim.token, TaskSpec("c", budget_micro_usd=3_000, call_cap=3)).id
    assert store.get_task(parent).envelope.call_cap == 2 and _slice(store, parent)["call_cap"] == 2
    assert _goal_row(store, goal)["escrowed_calls"] == 2 and _goal_row(store, goal)["allocated_calls"] == 5
    pooled = store.delegate(parent, claim.token, TaskSpec("c2", budget_micro_usd=1_000)).id  # no cap: the pool's
    child_claim = store.claim(goal, "w2", 60, task_id=child)
    assert child_claim is not None and _slice(store, child)["call_cap"] == 3
    store.settle(store.reserve(child, child_claim.token, model="m", amount=500, method="x").id, 500)
    check_escrow_binds(store, goal)
    store.complete(child, child_claim.token)  # its 2 unused calls and 2,500 unspent go back into the parent
    assert store.get_task(parent).envelope.call_cap == 4 and _slice(store, parent)["call_cap"] == 4
    assert _slice(store, parent)["slice"] == 8_500 and _goal_row(store, goal)["escrowed_calls"] == 4
    check_escrow_binds(store, goal)
    for _ in range(4):
        store.reserve(parent, claim.token, model="m", amount=1, method="x")
    pooled_claim = store.claim(goal, "w3", 60, task_id=pooled)
    assert pooled_claim is not None
    for _ in range(3):  # the goal's 3 unallocated calls
        store.reserve(pooled, pooled_claim.token, model="m", amount=1, method="x")
    with pytest.raises(CallCapExceededError):
        store.reserve(pooled, pooled_claim.token, model="m", amount=1, method="x")
    assert store.get_goal(goal).envelope.calls == 8
    check_escrow_binds(store, goal)


def test_a_crash_between_claim_and_carve_charges_the_goal(escrow_store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    store, _ = escrow_store
    goal = store.create_goal(GoalSpec("g", 100_000, 0)).id
    task = store.create_task(goal, TaskSpec("t", budget_micro_usd=10_000)).id
    monkeypatch.setattr(store, "_carve", lambda *a: False)  # the claim committed, its slice never moved
    claim = store.claim(goal, "w", 60)
    monkeypatch.undo()
    assert claim is not None and _slice(store, task)["token"] is None
    hold = store.reserve(task, claim.token, model="m", amount=1_000, method="x")
    assert _goal_row(store, goal)["reserved"] == 1_000
    store.settle(hold.id, 600)
    store.complete(task, claim.token)
    assert _goal_row(store, goal)["settled"] == 600 and store.get_goal(goal).envelope.settled == 600
    check_escrow_binds(store, goal)


def test_an_existing_store_is_upgraded_with_its_holds_on_the_goal(store_url: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_sql, "MIGRATIONS", MIGRATIONS[:9])  # the schema before escrow
    old = open_store(store_url)
    goal, task, token = "goal_old", "task_old", 1
    with old._e.write() as cur:  # a claimed task with a hold, as that version made them (the goal charged)
        cur.execute("INSERT INTO goals (id, objective, budget, call_cap, max_depth, policy, created_at, allocated, "
                    "reserved, calls) VALUES (?, 'g', 100000, 0, 2, 'team', 0, 10000, 1000, 1)", (goal,))
        cur.execute("INSERT INTO tasks (id, goal_id, depth, group_name, title, prompt, priority, state, "
                    "fencing_token, worker_id, lease_expires_at, created_at, budget, call_cap, reserved, calls) "
                    "VALUES (?, ?, 0, 'main', 't', '', 0, 'claimed', ?, 'w', ?, 0, 10000, 0, 1000, 1)",
                    (task, goal, token, time.time() + 600))
        cur.execute(f"INSERT INTO reservations ({rows.RESERVATION_COLS}) VALUES "
                    "('rsv_old', ?, ?, 'm', 1000, NULL, 'held', 'x', 0, 0, 0, 0, 0, 'w')", (goal, task))
        cur.execute("SELECT setval('fencing_seq', 1)" if old._e.postgres else
                    "UPDATE counters SET value = 1 WHERE name = 'fencing'")
    old.close()
    monkeypatch.undo()
    hold_id = "rsv_old"
    store = open_store(store_url)
    try:
        assert _slice(store, task)["token"] is None  # an upgraded claim has no slice: it charges the goal
        store.settle(hold_id, 700)
        store.settle(store.reserve(task, token, model="m", amount=100, method="x").id, 100)
        store.complete(task, token)
        assert _goal_row(store, goal)["settled"] == 800 and store.get_goal(goal).envelope.calls == 2
        check_escrow_binds(store, goal)
    finally:
        store.close()


def test_concurrent_claims_calls_expiries_and_sweeps_keep_the_budget(store_url: str) -> None:
    """Threads claim, hold, settle and end claims while another lets leases lapse and sweeps: the budget binds
    at every step checked and every slice is returned once."""
    clock = FakeClock()
    store = open_store(store_url, clock=clock)
    goal = store.create_goal(GoalSpec("g", 60_000, 0)).id
    for i in range(12):
        store.create_task(goal, TaskSpec(f"t{i}", budget_micro_usd=5_000))
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for round_ in range(6):
                claim = store.claim(goal, f"w{n}", 5)
                if claim is None:
                    return
                for _ in range(3):
                    try:
                        hold = store.reserve(claim.task.id, claim.token, model="m", amount=700, method="x")
                    except (BudgetExceededError, FencingError):
                        break
                    with contextlib.suppress(IllegalTransitionError):
                        store.settle(hold.id, 500)
                try:
                    if (n + round_) % 3 == 0:
                        continue  # walk away: the lease lapses, a sweep or a re-claim returns the slice
                    if (n + round_) % 3 == 1:
                        store.release(claim.task.id, claim.token)
                    else:
                        store.complete(claim.task.id, claim.token)
                except FencingError:
                    pass
        except BaseException as exc:
            errors.append(exc)

    def sweeper() -> None:
        try:
            for _ in range(20):
                clock.advance(2)
                store.return_ended_slices(goal)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)] + [threading.Thread(target=sweeper)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors
        check_escrow_binds(store, goal)
        clock.advance(100)
        store.return_ended_slices(goal)
        assert _goal_row(store, goal)["escrowed"] == 0
        check_escrow_binds(store, goal)
    finally:
        store.close()


# -- the state machine ---------------------------------------------------------------------------------------

WORKERS = ["w0", "w1", "w2"]
LEASE_S = 10.0


class EscrowMachine(RuleBasedStateMachine):
    """Claims (some refused as too small, some whose slice a crash kept from moving), holds, settlements,
    losses, reconciliations, delegations, cancellations, claim ends, lease expiries, sweeps and crashes of the
    process holding claims, in any order: the budget binds after every step."""

    url_factory: object

    @initialize(cap=st.sampled_from([0, 9, 14]))
    def setup(self, cap: int) -> None:
        self.clock = FakeClock()
        self.url = self.url_factory()  # type: ignore[operator]
        self.store: SqlStore = open_store(self.url, clock=self.clock)
        self.goal = self.store.create_goal(GoalSpec("g", 20_000, cap, max_depth=2)).id
        for i, (budget, calls) in enumerate([(6_000, 4), (4_000, 0), (3_000, 5)]):
            self.store.create_task(self.goal, TaskSpec(f"t{i}", budget_micro_usd=budget, call_cap=calls))
        self.held: dict[str, tuple[str, int]] = {}
        self.open: list[str] = []
        self.unknown: list[str] = []

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.close()

    def _tokens(self) -> dict[str, Any]:
        return {t.id: t.fencing_token for t in self.store.list_tasks(self.goal)}

    def _has_call(self, task_id: str) -> bool:
        """Whether the task could make one more model call: its own cap, or its goal's unallocated calls."""
        task = self.store.get_task(task_id).envelope
        if task.call_cap:
            return task.calls < task.call_cap
        row = _goal_row(self.store, self.goal)
        return not row["call_cap"] or (row["allocated_calls"] < row["call_cap"]
                                       and row["calls"] + row["escrowed_calls"] < row["call_cap"])

    @rule(worker=st.sampled_from(WORKERS), least=st.sampled_from([0, 0, 1_500, 7_000]), crash=st.booleans(),
          calls=st.booleans())
    def claim(self, worker: str, least: int, crash: bool, calls: bool) -> None:
        before = self._tokens()
        if crash:  # PostgreSQL's claim committed and the process died before the slice moved
            self.store._carve = lambda *a: False  # type: ignore[method-assign]
        try:
            claim = self.store.claim(self.goal, worker, LEASE_S, min_slice_micro_usd=least, calls=calls)
        except NoCallsLeftError as refused:
            assert calls or least
            assert not self._has_call(refused.envelope.split()[1]), "refused a task with a call left"
            assert self._tokens() == before, "a claim refused for its calls was made"
            return
        except BudgetExceededError as refused:
            assert least and refused.available < least
            assert self._tokens() == before, "a claim refused as too small was made"
            return
        finally:
            if crash:
                del self.store._carve
        if claim is not None:
            assert claim.task.envelope.available >= least
            # the rule: a claimer that calls models is never handed a task that can make no call
            assert not (calls or least) or claim.task.envelope.call_cap == 0 or (
                claim.task.envelope.calls < claim.task.envelope.call_cap), "handed a task with no call left"
            self.held[worker] = (claim.task.id, claim.token)

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data(), amount=st.integers(0, 2_500))
    def reserve(self, data: st.DataObject, amount: int) -> None:
        worker = data.draw(st.sampled_from(sorted(self.held)))
        task_id, token = self.held[worker]
        before = self.store.get_task(task_id).envelope
        try:
            self.open.append(self.store.reserve(task_id, token, model="m", amount=amount, method="x").id)
        except (BudgetExceededError, CallCapExceededError, FencingError):
            assert self.store.get_task(task_id).envelope == before, "a refused hold charged its task"

    @precondition(lambda self: bool(self.open))
    @rule(data=st.data(), fraction=st.integers(0, 120), how=st.sampled_from(["settle", "release", "lose"]))
    def end_hold(self, data: st.DataObject, fraction: int, how: str) -> None:
        rid = data.draw(st.sampled_from(self.open))
        self.open.remove(rid)
        if how == "settle":
            self.store.settle(rid, self.store.get_reservation(rid).amount * fraction // 100)
        elif how == "release":
            self.store.release_reservation(rid)
        else:
            self.store.mark_unknown(rid)
            self.unknown.append(rid)

    @precondition(lambda self: bool(self.unknown))
    @rule(data=st.data(), release=st.booleans())
    def reconcile(self, data: st.DataObject, release: bool) -> None:
        rid = data.draw(st.sampled_from(self.unknown))
        self.unknown.remove(rid)
        self.store.reconcile(rid, None if release else self.store.get_reservation(rid).amount // 2)

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data(), action=st.sampled_from(["complete", "fail", "release"]))
    def end_claim(self, data: st.DataObject, action: str) -> None:
        worker = data.draw(st.sampled_from(sorted(self.held)))
        task_id, token = self.held.pop(worker)
        try:
            if action == "complete":
                self.store.complete(task_id, token, "ok")
            elif action == "fail":
                self.store.fail(task_id, token, "no")
            else:
                self.store.release(task_id, token)
        except FencingError:
            pass

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data(), budget=st.integers(0, 4_000), calls=st.sampled_from([0, 1, 3]))
    def delegate(self, data: st.DataObject, budget: int, calls: int) -> None:
        worker = data.draw(st.sampled_from(sorted(self.held)))
        task_id, token = self.held[worker]
        before = self.store.get_task(task_id).envelope
        try:
            self.store.delegate(task_id, token, TaskSpec("sub", budget_micro_usd=budget, call_cap=calls))
        except (BudgetExceededError, CallCapExceededError, FencingError, DepthExceededError):
            assert self.store.get_task(task_id).envelope == before, "a refused delegation carved its parent"

    @rule(budget=st.integers(0, 5_000), calls=st.sampled_from([0, 1, 2, 4]))
    def create_task(self, budget: int, calls: int) -> None:
        """A later task gets what is unallocated, which ended tasks gave back: refused exactly when the goal's
        unallocated budget, or calls, cannot cover it."""
        row = _goal_row(self.store, self.goal)
        fits = (row["budget"] - row["allocated"] >= budget
                and (not row["call_cap"] or row["call_cap"] - row["allocated_calls"] >= calls))
        try:
            self.store.create_task(self.goal, TaskSpec("later", budget_micro_usd=budget, call_cap=calls))
        except (BudgetExceededError, CallCapExceededError):
            assert not fits, "a task the goal's unallocated budget and calls cover was refused"
            assert _goal_row(self.store, self.goal) == row
        else:
            assert fits, "a task was allocated more than the goal had unallocated"

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        live = [t.id for t in self.store.list_tasks(self.goal) if t.state in (TaskState.PENDING, TaskState.CLAIMED)]
        if live:
            self.store.cancel_task(data.draw(st.sampled_from(live)), "cancelled")

    @rule(least=st.sampled_from([1_500, 7_000]))
    def fail_unaffordable(self, least: int) -> None:
        """A run fails the tasks an agent's claim was refused for: each claimable one short of ``least``, once,
        with no slice carved; its unspent budget stays in the goal (a live ancestor's, or unallocated)."""
        now = self.clock.now()
        before = {t.id: t for t in self.store.list_tasks(self.goal)}
        failed = self.store.fail_unaffordable(self.goal, least)
        for task in failed:
            was = before[task.id]
            assert was.state is TaskState.PENDING or (
                was.state is TaskState.CLAIMED and was.lease_expires_at is not None and was.lease_expires_at <= now)
            assert task.state is TaskState.FAILED and task.envelope.available == 0
            if was.envelope.available < least:
                assert "cannot afford one model call" in (task.result or "")
            else:  # no call left, and no live task of the goal holds unused calls it could give back
                assert "no model call left" in (task.result or "")
                assert was.envelope.call_cap == 0 or was.envelope.calls >= was.envelope.call_cap
                assert not any(t.envelope.call_cap > t.envelope.calls for t in self.store.list_tasks(self.goal)
                               if t.state in (TaskState.PENDING, TaskState.CLAIMED))
        assert self.store.fail_unaffordable(self.goal, least) == [], "a task was failed twice"
        allocated = _goal_row(self.store, self.goal)["allocated"]
        assert sum(t.envelope.limit for t in self.store.list_tasks(self.goal)) == allocated

    @rule(seconds=st.sampled_from([1.0, 6.0, 11.0]))
    def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule()
    def sweep(self) -> None:
        self.store.return_ended_slices()
        assert self.store.return_ended_slices() == [], "a sweep returned a slice twice"

    @rule(resume=st.booleans())
    def crash(self, resume: bool) -> None:
        """The process holding the claims dies (kill -9): its workers are gone, its holds stay open in the store;
        a new process opens the store and, resuming the run, returns every slice of the goal."""
        self.store.close()
        self.store = open_store(self.url, clock=self.clock)
        self.held.clear()
        if resume:
            self.store.return_ended_slices(self.goal, every=True)

    @invariant()
    def the_budget_binds(self) -> None:
        if hasattr(self, "store"):
            check_escrow_binds(self.store, self.goal)


@pytest.fixture
def url_factory(store_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> object:
    counter = iter(range(10_000))
    if store_url.startswith("sqlite"):
        return lambda: f"sqlite:///{tmp_path / f'escrow{next(counter)}.db'}"
    import psycopg

    server = request.getfixturevalue("pg_server_url")

    def fresh() -> str:
        schema = f"esc_{next(counter)}_{id(request)}"
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            conn.execute(f'CREATE SCHEMA "{schema}"')
        sep = "&" if "?" in server else "?"
        return f"{server}{sep}options=-csearch_path%3D{schema}"

    return fresh


@pytest.mark.slow
def test_escrow_state_machine(url_factory: object) -> None:
    EscrowMachine.url_factory = staticmethod(url_factory)  # type: ignore[arg-type]
    test = EscrowMachine.TestCase
    test.settings = settings(max_examples=40, stateful_step_count=40, deadline=None,
                             suppress_health_check=list(HealthCheck))
    test().runTest()
