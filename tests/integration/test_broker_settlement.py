"""Admission and settlement on the loop when the store lets them (else on the store threads), a dead broker's
hold is reconcilable, revocation is immediate."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from conftest import claimed_worker
from swarmyard.broker import BrokerSettings, ModelRoute, create_broker_app
from swarmyard.broker.app import Broker
from swarmyard.broker.chat import ChatRequest, Usage
from swarmyard.broker.formats import OPENAI_CHAT
from swarmyard.broker.providers.scripted import Say, ScriptedProvider
from swarmyard.clock import FakeClock
from swarmyard.domain import GoalSpec, ReservationState, TaskSpec
from swarmyard.errors import IllegalTransitionError
from swarmyard.store import SqlStore, open_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    opened = open_store(f"sqlite:///{tmp_path / 'store.db'}", clock=FakeClock())
    yield opened
    opened.close()


def test_a_hold_left_by_a_dead_broker_is_reconcilable_once(store: SqlStore) -> None:
    goal = store.create_goal(GoalSpec("g", budget_micro_usd=1_000, call_cap=10))
    task = store.create_task(goal.id, TaskSpec("t", budget_micro_usd=1_000, call_cap=10))
    claim = store.claim(goal.id, "w", 60)
    assert claim is not None
    # a broker admitted the call, answered, and died before its settlement was written
    held = store.reserve(task.id, claim.token, model="m", amount=400, method="bytes")
    assert store.get_reservation(held.id).state is ReservationState.HELD
    settled = store.reconcile(held.id, 150)
    assert settled.state is ReservationState.SETTLED and settled.actual == 150
    # a late settlement (the broker was alive after all) is refused: the envelopes move once
    with pytest.raises(IllegalTransitionError):
        store.settle(held.id, 300)
    envelope = store.get_goal(goal.id).envelope
    assert (envelope.reserved, envelope.settled) == (0, 150)
    released = store.reconcile(store.reserve(task.id, claim.token, model="m", amount=100, method="bytes").id, None)
    assert released.state is ReservationState.RELEASED
    assert store.get_task(task.id).envelope.available == 850


def test_revocation_takes_effect_on_the_next_call(store: SqlStore) -> None:
    worker = claimed_worker(store, FakeClock(), secret=b"r" * 32, call_cap=10)
    settings = BrokerSettings(routes=(ModelRoute("m", "scripted", input_per_mtok=1, output_per_mtok=1),))
    app = create_broker_app(store, worker.tokens, {"scripted": ScriptedProvider({"*": [Say("ok")] * 3})}, settings)
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"authorization": f"Bearer {worker.token}"}
    with TestClient(app) as client:
        assert client.post("/v1/chat/completions", json=body, headers=headers).status_code == 200
        worker.tokens.revoke(worker.worker_id)  # the verified signature is cached; revocation is not
        refused = client.post("/v1/chat/completions", json=body, headers=headers)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_token"
        assert app.state.broker.wait_settled(10)
    assert [r.state for r in store.list_reservations(worker.goal_id)] == [ReservationState.SETTLED]


@dataclass
class LoopRig:
    """A broker object (no server) over a worker holding a claim, its route and a request to admit, and a
    second SQLite connection standing for another process's writer."""

    broker: Broker
    token: str
    route: ModelRoute
    chat: ChatRequest
    goal_id: str
    other: sqlite3.Connection


@pytest.fixture
def loop_rig(store: SqlStore, tmp_path: Path) -> Iterator[LoopRig]:
    worker = claimed_worker(store, FakeClock(), secret=b"i" * 32, call_cap=10)
    route = ModelRoute("m", "scripted", input_per_mtok=1_000_000, output_per_mtok=1_000_000)
    broker = Broker(store, worker.tokens, {"scripted": ScriptedProvider()}, BrokerSettings(routes=(route,)))
    chat = OPENAI_CHAT.parse({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})
    other = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    yield LoopRig(broker, worker.token, route, chat, worker.goal_id, other)
    other.close()


def test_admission_runs_on_the_loop_when_the_lock_is_free_and_queues_when_it_is_not(
        store: SqlStore, loop_rig: LoopRig) -> None:
    rig = loop_rig

    async def main() -> list[str]:
        rig.other.execute("BEGIN IMMEDIATE")
        queued = asyncio.ensure_future(rig.broker._admission(rig.token, rig.chat, rig.route, 100))
        await asyncio.sleep(0)  # one loop turn: the attempt on the loop found the lock taken and queued
        assert not queued.done()
        rig.other.execute("COMMIT")
        first = await queued
        # with the store threads closed, only an admission on the loop itself can succeed
        await asyncio.get_running_loop().run_in_executor(None, rig.broker._threads.shutdown)
        second = await rig.broker._admission(rig.token, rig.chat, rig.route, 100)
        with pytest.raises(RuntimeError):  # a body too large to count on the loop still goes to the threads
            await rig.broker._admission(rig.token, rig.chat, rig.route, 10**6)
        return [first.reservation.id, second.reservation.id]

    ids = asyncio.run(main())
    assert [r.id for r in store.list_reservations(rig.goal_id, state=ReservationState.HELD)] == ids


def test_settlement_runs_on_the_loop_after_the_answer_or_on_the_threads_when_the_store_is_busy(
        store: SqlStore, loop_rig: LoopRig) -> None:
    rig = loop_rig

    async def main() -> None:
        on_loop = await rig.broker._admission(rig.token, rig.chat, rig.route, 100)
        rig.broker._settle_soon(on_loop, Usage(3, 4))
        assert store.get_reservation(on_loop.reservation.id).state is ReservationState.HELD  # not before the turn
        await asyncio.sleep(0)  # one loop turn (the answer would be written in this one)
        assert store.get_reservation(on_loop.reservation.id).actual == 7
        queued = await rig.broker._admission(rig.token, rig.chat, rig.route, 100)
        rig.other.execute("BEGIN IMMEDIATE")
        rig.broker._settle_soon(queued, Usage(1, 1))
        await asyncio.sleep(0)  # the loop found the store busy and handed the settlement to the threads
        assert store.get_reservation(queued.reservation.id).state is ReservationState.HELD
        rig.other.execute("COMMIT")
        assert await asyncio.get_running_loop().run_in_executor(None, rig.broker.wait_settled, 10)

    asyncio.run(main())
    assert {r.actual for r in store.list_reservations(rig.goal_id)} == {7, 2}
    assert store.get_goal(rig.goal_id).envelope.reserved == 0


def test_calls_are_admitted_and_settled_on_either_store(store_url: str) -> None:
    # SQLite admits and settles on the loop; PostgreSQL (never on the loop) on the store threads
    store = open_store(store_url, clock=FakeClock())
    try:
        worker = claimed_worker(store, FakeClock(), secret=b"e" * 32, call_cap=10)
        settings = BrokerSettings(routes=(ModelRoute("m", "scripted", input_per_mtok=1_000_000,
                                                     output_per_mtok=1_000_000),))
        script = ScriptedProvider({"*": [Say("one two three", input_tokens=5, output_tokens=3)] * 2})
        app = create_broker_app(store, worker.tokens, {"scripted": script}, settings)
        headers = {"authorization": f"Bearer {worker.token}"}
        body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
        with TestClient(app) as client:
            for stream in (False, True):
                answer = client.post("/v1/chat/completions", json={**body, "stream": stream}, headers=headers)
                assert answer.status_code == 200
            assert app.state.broker.wait_settled(10)
        assert [(r.state, r.actual) for r in store.list_reservations(worker.goal_id)] == [
            (ReservationState.SETTLED, 8), (ReservationState.SETTLED, 8)]
        assert store.get_goal(worker.goal_id).envelope.reserved == 0
    finally:
        store.close()


@pytest.mark.postgres
def test_a_settlement_whose_connection_the_server_ends_mid_transaction_is_written_on_a_new_one(
        pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    # A PostgreSQL server that stops or restarts ends the transactions in flight (AdminShutdown). A settlement
    # caught so used to leave its hold `held` for good (a run's leftover hold); it is written again, once.
    import psycopg

    store = open_store(pg_url, clock=FakeClock())
    locker = psycopg.connect(pg_url)  # another session, standing for whatever held the row when the server went
    try:
        worker = claimed_worker(store, FakeClock(), secret=b"p" * 32, call_cap=10)
        route = ModelRoute("m", "scripted", input_per_mtok=1_000_000, output_per_mtok=1_000_000)
        broker = Broker(store, worker.tokens, {"scripted": ScriptedProvider()}, BrokerSettings(routes=(route,)))
        chat = OPENAI_CHAT.parse({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})

        def waiting_on_the_lock() -> list[int]:  # (a session of its own: one in a transaction sees a snapshot)
            with psycopg.connect(pg_url, autocommit=True) as watch:
                rows = watch.execute("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                     "AND query LIKE 'UPDATE reservations%%'").fetchall()
            return [int(row[0]) for row in rows]

        async def main() -> str:
            admitted = await broker._admission(worker.token, chat, route, 100)
            locker.execute("SELECT 1 FROM reservations WHERE id = %s FOR UPDATE", (admitted.reservation.id,))
            broker._settle_soon(admitted, Usage(3, 4))
            while not (pids := waiting_on_the_lock()):  # progress: the settlement's UPDATE waits on the row
                await asyncio.sleep(0.01)
            with psycopg.connect(pg_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pids[0],))
            locker.rollback()
            assert await asyncio.get_running_loop().run_in_executor(None, broker.wait_settled, 120)
            return admitted.reservation.id

        with caplog.at_level("WARNING", logger="swarmyard.broker.holds"):
            reservation_id = asyncio.run(main())
        settled = store.get_reservation(reservation_id)
        assert (settled.state, settled.actual) == (ReservationState.SETTLED, 7)
        assert store.get_goal(worker.goal_id).envelope.reserved == 0
        assert any("connection was lost while marking it settled" in r.getMessage() for r in caplog.records)
    finally:
        locker.close()
        store.close()
