"""Hypothesis state machines for claims and for the ledger, on both engines, with the fake clock.

Invariants: fencing tokens strictly increase; at most one live claim per task; a stale token or an expired
lease never writes; reserve then release restores an envelope exactly; no envelope is ever negative and
reserved + settled never exceeds it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from swarmyard.clock import FakeClock
from swarmyard.domain import GoalSpec, PostKind, ReservationState, TaskSpec, TaskState
from swarmyard.errors import BudgetExceededError, CallCapExceededError, FencingError
from swarmyard.store import SqlStore, open_store

WORKERS = ["w0", "w1", "w2"]
LEASE_S = 10.0


def _run(machine: type[RuleBasedStateMachine], url_factory: object) -> None:
    machine.url_factory = staticmethod(url_factory)  # type: ignore[attr-defined]
    test = machine.TestCase
    test.settings = settings(max_examples=25, stateful_step_count=30, deadline=None,
                             suppress_health_check=list(HealthCheck))
    test().runTest()


class ClaimMachine(RuleBasedStateMachine):
    """Workers claim, renew, post, complete and lose leases as the clock moves."""

    url_factory: object

    @initialize()
    def setup(self) -> None:
        self.clock = FakeClock()
        self.store: SqlStore = open_store(self.url_factory(), clock=self.clock)  # type: ignore[operator]
        self.goal = self.store.create_goal(GoalSpec("g", 1_000_000, 1000)).id
        self.tasks = [self.store.create_task(self.goal, TaskSpec(f"t{i}")).id for i in range(3)]
        self.held: dict[str, tuple[str, int]] = {}  # worker -> (task, token), as the worker believes
        self.max_token = 0
        self.posts = 0

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.close()

    @rule(worker=st.sampled_from(WORKERS))
    def claim(self, worker: str) -> None:
        claim = self.store.claim(self.goal, worker, LEASE_S)
        if claim is not None:
            assert claim.token > self.max_token, "fencing tokens must strictly increase"
            self.max_token = claim.token
            self.held[worker] = (claim.task.id, claim.token)

    @rule(seconds=st.sampled_from([1.0, 5.0, 9.0, 11.0]))
    def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def _live(self, task_id: str, token: int) -> bool:
        task = self.store.get_task(task_id)
        return (task.fencing_token == token and task.state is TaskState.CLAIMED
                and task.lease_expires_at is not None and task.lease_expires_at > self.clock.now())

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data(), action=st.sampled_from(["post", "renew", "complete", "release"]))
    def write(self, data: st.DataObject, action: str) -> None:
        worker = data.draw(st.sampled_from(sorted(self.held)))
        task_id, token = self.held[worker]
        live = self._live(task_id, token)
        before = len(self.store.read_board(self.goal, limit=10_000))
        try:
            if action == "post":
                self.store.post(task_id, token, PostKind.NOTE, "x", author=worker)
                self.posts += 1
            elif action == "renew":
                self.store.renew(task_id, token, LEASE_S)
            elif action == "complete":
                self.store.complete(task_id, token, "done")
                del self.held[worker]
            else:
                self.store.release(task_id, token)
                del self.held[worker]
        except FencingError:
            assert not live, "a live claim was refused"
            assert len(self.store.read_board(self.goal, limit=10_000)) == before, "a refused write landed"
            del self.held[worker]
        else:
            assert live, "a stale token or expired lease wrote"

    @invariant()
    def one_live_claim_per_task(self) -> None:
        if not hasattr(self, "store"):
            return
        now = self.clock.now()
        for task in self.store.list_tasks(self.goal):
            if task.state is TaskState.CLAIMED and task.lease_expires_at and task.lease_expires_at > now:
                holders = [w for w, (t, tok) in self.held.items() if t == task.id and tok == task.fencing_token]
                assert len(holders) <= 1


class LedgerMachine(RuleBasedStateMachine):
    """Reservations are held, settled, released, lost and reconciled; envelopes stay exact."""

    url_factory: object

    @initialize()
    def setup(self) -> None:
        self.clock = FakeClock()
        self.store: SqlStore = open_store(self.url_factory(), clock=self.clock)  # type: ignore[operator]
        self.goal = self.store.create_goal(GoalSpec("g", 10_000, 40)).id
        self.tasks = []
        for i in range(2):
            task = self.store.create_task(self.goal, TaskSpec(f"t{i}", budget_micro_usd=4_000, call_cap=15))
            claim = self.store.claim(self.goal, f"w{i}", 3600, task_id=task.id)
            assert claim is not None
            self.tasks.append((task.id, claim.token))
        self.open: list[str] = []
        self.unknown: list[str] = []

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.close()

    @rule(which=st.integers(0, 1), amount=st.integers(0, 3_000))
    def reserve(self, which: int, amount: int) -> None:
        task_id, token = self.tasks[which]
        before = self.store.get_task(task_id).envelope
        try:
            r = self.store.reserve(task_id, token, model="m", amount=amount, method="bytes")
        except (BudgetExceededError, CallCapExceededError):
            assert self.store.get_task(task_id).envelope == before
            return
        self.open.append(r.id)

    @precondition(lambda self: bool(self.open))
    @rule(data=st.data())
    def release_restores_exactly(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self.open))
        r = self.store.get_reservation(rid)
        before = self.store.get_task(r.task_id).envelope
        self.store.release_reservation(rid)
        after = self.store.get_task(r.task_id).envelope
        assert after.available == before.available + r.amount
        assert after.settled == before.settled
        self.open.remove(rid)

    @precondition(lambda self: bool(self.open))
    @rule(data=st.data(), fraction=st.integers(0, 120))
    def settle(self, data: st.DataObject, fraction: int) -> None:
        rid = data.draw(st.sampled_from(self.open))
        amount = self.store.get_reservation(rid).amount
        self.store.settle(rid, amount * fraction // 100)
        self.open.remove(rid)

    @precondition(lambda self: bool(self.open))
    @rule(data=st.data())
    def lose(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self.open))
        self.store.mark_unknown(rid)
        self.open.remove(rid)
        self.unknown.append(rid)

    @precondition(lambda self: bool(self.unknown))
    @rule(data=st.data(), release=st.booleans())
    def reconcile(self, data: st.DataObject, release: bool) -> None:
        rid = data.draw(st.sampled_from(self.unknown))
        amount = self.store.get_reservation(rid).amount
        self.store.reconcile(rid, None if release else amount // 2)
        self.unknown.remove(rid)

    @invariant()
    def envelopes_are_exact_and_never_negative(self) -> None:
        if not hasattr(self, "store"):
            return
        goal = self.store.get_goal(self.goal).envelope
        reservations = self.store.list_reservations(self.goal)
        held = sum(r.amount for r in reservations if r.state in (ReservationState.HELD, ReservationState.UNKNOWN))
        spent = sum(min(r.actual or 0, r.amount) for r in reservations if r.state is ReservationState.SETTLED)
        assert (goal.reserved, goal.settled) == (held, spent)
        assert goal.available >= 0 and goal.reserved + goal.settled <= goal.limit
        for task_id, _ in self.tasks:
            env = self.store.get_task(task_id).envelope
            assert env.available >= 0 and env.reserved >= 0 and env.settled >= 0


@pytest.fixture
def url_factory(store_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> object:
    counter = iter(range(10_000))
    if store_url.startswith("sqlite"):
        return lambda: f"sqlite:///{tmp_path / f'store{next(counter)}.db'}"
    import psycopg

    server = request.getfixturevalue("pg_server_url")

    def fresh() -> str:
        schema = f"sm_{next(counter)}_{id(request)}"
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            conn.execute(f'CREATE SCHEMA "{schema}"')
        sep = "&" if "?" in server else "?"
        return f"{server}{sep}options=-csearch_path%3D{schema}"

    return fresh


@pytest.mark.slow
def test_claims_state_machine(url_factory: object) -> None:
    _run(ClaimMachine, url_factory)


@pytest.mark.slow
def test_ledger_state_machine(url_factory: object) -> None:
    _run(LedgerMachine, url_factory)
