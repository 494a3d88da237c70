"""A hold is written by one statement that checks and writes, and a held hold ends by one that checks and writes:
what each refuses, what each leaves in the envelopes and the audit log, on both engines.

Every store here is its own object (its own connections), as ``serve`` replicas over one database are.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from tests.conftest import claimed_worker

from swarmyard.auth.tokens import token_hash
from swarmyard.clock import FakeClock
from swarmyard.domain import ReservationState
from swarmyard.errors import DuplicateInFlightError, DuplicateOfUnknownError, IllegalTransitionError
from swarmyard.store import SqlStore, open_store

SECRET = b"h" * 32


@pytest.fixture
def pair(store_url: str, clock: FakeClock) -> Iterator[tuple[SqlStore, SqlStore]]:
    opened = [open_store(store_url, clock=clock, pool_size=4) for _ in range(2)]
    yield opened[0], opened[1]
    for s in opened:
        s.close()


def _events(store: SqlStore, kind: str) -> list[dict[str, object]]:
    store.sequence_events()
    return [json.loads(e.body) for e in store.read_events(0, 10_000) if e.kind == kind]


def test_a_body_in_flight_on_another_replica_is_refused_there_and_nothing_is_held(
        pair: tuple[SqlStore, SqlStore], clock: FakeClock) -> None:
    first, second = pair
    first.register_plane("pln_first")
    second.register_plane("pln_second")
    worker = claimed_worker(first, clock, secret=SECRET)
    hashed = token_hash(worker.token)
    flying = first.reserve_for_worker(worker.worker_id, hashed, model="m", amount=100, method="bytes",
                                      body_digest="same")
    task_before = second.get_task(second.current_claim(worker.worker_id).task.id).envelope  # type: ignore[union-attr]
    held_events = len(_events(second, "reservation.held"))
    with pytest.raises(DuplicateInFlightError, match=flying.id) as info:
        second.reserve_for_worker(worker.worker_id, hashed, model="m", amount=100, method="bytes",
                                  body_digest="same")
    assert info.value.retryable and info.value.reservation_id == flying.id
    # refused inside the hold's transaction: the task's charge and call went back with it, no row, no event
    claim = second.current_claim(worker.worker_id)
    assert claim is not None and second.get_task(claim.task.id).envelope == task_before
    assert [r.id for r in second.list_reservations(worker.goal_id)] == [flying.id]
    assert len(_events(second, "reservation.held")) == held_events
    # the replica that holds it is not refused (its own broker answers a lost body's resend), nor another body
    again = first.reserve_for_worker(worker.worker_id, hashed, model="m", amount=100, method="bytes",
                                     body_digest="same")
    other = second.reserve_for_worker(worker.worker_id, hashed, model="m", amount=100, method="bytes",
                                      body_digest="another")
    # once the first call settled, the body may go again anywhere
    first.settle(flying.id, 40)
    first.settle(again.id, 40)
    later = second.reserve_for_worker(worker.worker_id, hashed, model="m", amount=100, method="bytes",
                                      body_digest="same")
    assert {r.state for r in (later, other)} == {ReservationState.HELD}


def test_a_lost_body_is_refused_before_one_in_flight(pair: tuple[SqlStore, SqlStore], clock: FakeClock) -> None:
    first, second = pair
    first.register_plane("pln_first")
    second.register_plane("pln_second")
    worker = claimed_worker(first, clock, secret=SECRET)
    hashed = token_hash(worker.token)
    lost = first.reserve_for_worker(worker.worker_id, hashed, model="m", amount=100, method="bytes",
                                    body_digest="b")
    first.mark_unknown(lost.id)
    first.reserve_for_worker(worker.worker_id, hashed, model="m", amount=100, method="bytes", body_digest="c")
    with pytest.raises(DuplicateOfUnknownError, match=lost.id):
        second.reserve_for_worker(worker.worker_id, hashed, model="m", amount=100, method="bytes",
                                  body_digest="b")
    # without a plane (a store outside serve) only lost bodies are refused
    plain = open_store(first.url, clock=clock, blob_dir=first.blob_dir)
    try:
        with pytest.raises(DuplicateOfUnknownError, match=lost.id):
            plain.reserve_for_worker(worker.worker_id, hashed, model="m", amount=100, method="bytes",
                                     body_digest="b")
        assert plain.reserve_for_worker(worker.worker_id, hashed, model="m", amount=100, method="bytes",
                                        body_digest="c").state is ReservationState.HELD
    finally:
        plain.close()


def test_a_hold_ends_once_and_says_what_it_ended_from(pair: tuple[SqlStore, SqlStore], clock: FakeClock) -> None:
    store, other = pair
    worker = claimed_worker(store, clock, secret=SECRET)
    hashed = token_hash(worker.token)

    def hold(amount: int) -> str:
        return store.reserve_for_worker(worker.worker_id, hashed, model="m", amount=amount, method="bytes").id

    settled, over, released, lost = hold(1_000), hold(100), hold(500), hold(300)
    clock.advance(2)
    done = store.settle(settled, 400, input_tokens=30, output_tokens=7)
    # what settle answers is the row as stored
    assert done == other.get_reservation(settled)
    assert (done.state, done.actual, done.overage, done.updated_at) == (ReservationState.SETTLED, 400, 0, clock.now())
    assert (done.amount, done.input_tokens, done.output_tokens, done.worker_id) == (1_000, 30, 7, worker.worker_id)
    assert store.settle(over, 150).overage == 50  # charged up to the hold, the rest recorded
    assert other.release_reservation(released).actual is None
    store.mark_unknown(lost)
    with pytest.raises(IllegalTransitionError):
        other.mark_unknown(lost)
    assert store.reconcile(lost, 120).state is ReservationState.SETTLED  # from unknown: the row read first
    for rid in (settled, over, released):
        with pytest.raises(IllegalTransitionError):
            other.settle(rid, 1)
    with pytest.raises(IllegalTransitionError):
        store.reconcile(lost, None)
    claim = store.current_claim(worker.worker_id)
    assert claim is not None
    env = store.get_task(claim.task.id).envelope
    assert (env.reserved, env.settled, env.calls) == (0, 400 + 100 + 120, 4)
    ends = {e["reservation"]: e for e in _events(store, "reservation.settled")}
    assert {rid: ends[rid]["from"] for rid in ends} == {settled: "held", over: "held", lost: "unknown"}
    assert (ends[over]["charged"], ends[over]["overage"], ends[settled]["input_tokens"]) == (100, 50, 30)
    assert [e["from"] for e in _events(store, "reservation.released")] == ["held"]
