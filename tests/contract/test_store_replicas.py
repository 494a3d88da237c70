"""Several control-plane replicas over one store: a worker's rate bucket is one for all of them, a revoke
through one is seen by the others at the next call, and the holds of a replica that died are marked unknown.

Each "replica" here is its own store object (its own connections) and its own plane tools, as N ``serve``
processes are; they share only the database.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from tests.conftest import claimed_worker

from swarmyard.auth.tokens import TokenAuthority
from swarmyard.clock import FakeClock
from swarmyard.domain import PostKind, ReservationState
from swarmyard.errors import InvalidInputError, InvalidTokenError, RateLimitedError, StaleFencingTokenError
from swarmyard.plane import models as m
from swarmyard.plane.metrics import PlaneMetrics
from swarmyard.plane.settings import PlaneSettings
from swarmyard.plane.tools import WorkerTools
from swarmyard.store import SqlStore, open_store

SECRET = b"s" * 32


@pytest.fixture
def replicas(store_url: str, clock: FakeClock) -> Iterator[list[SqlStore]]:
    opened = [open_store(store_url, clock=clock, pool_size=8) for _ in range(3)]
    yield opened
    for s in opened:
        s.close()


def test_one_bucket_for_every_replica(replicas: list[SqlStore], clock: FakeClock) -> None:
    # 5 at once, then 1 a second, however the takes are spread over the replicas
    taken = [replicas[i % 3].take_rate_token("wrk_a", 1.0, 5) for i in range(9)]
    assert taken[:5] == [0.0] * 5
    assert all(wait > 0 for wait in taken[5:])
    assert taken[5] == pytest.approx(1.0)
    assert replicas[1].take_rate_token("wrk_b", 1.0, 5) == 0.0  # another key has its own bucket
    clock.advance(2.5)  # 2.5 tokens back: two takes, then a wait of half a second
    assert [replicas[(i + 1) % 3].take_rate_token("wrk_a", 1.0, 5) for i in range(3)][:2] == [0.0, 0.0]
    assert replicas[0].take_rate_token("wrk_a", 1.0, 5) == pytest.approx(0.5)
    clock.advance(3600)  # refills to the burst, never past it
    assert sum(replicas[i % 3].take_rate_token("wrk_a", 1.0, 5) == 0.0 for i in range(8)) == 5


def test_concurrent_takes_over_replicas_take_exactly_the_burst(replicas: list[SqlStore]) -> None:
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(lambda i: replicas[i % 3].take_rate_token("wrk_c", 0.001, 20), range(60)))
    assert sum(r == 0.0 for r in results) == 20


def test_bad_bucket_arguments_are_typed_and_change_nothing(replicas: list[SqlStore]) -> None:
    for key, rate, burst in (("", 1.0, 1), ("k" * 201, 1.0, 1), ("k", 0.0, 1), ("k", 1.0, 0)):
        with pytest.raises(InvalidInputError):
            replicas[0].take_rate_token(key, rate, burst)
    assert replicas[0].take_rate_token("k", 1.0, 1) == 0.0  # the bucket was never made by the refused calls


def _tools(store: SqlStore, clock: FakeClock, rate: float = 50.0, burst: int = 100) -> WorkerTools:
    tokens = TokenAuthority(SECRET, store, clock)
    return WorkerTools(store, tokens, PlaneSettings(rate_per_s=rate, rate_burst=burst), clock, PlaneMetrics(store))


def _read(store: SqlStore, worker_id: str) -> m.BoardReadRequest:
    claim = store.current_claim(worker_id)
    assert claim is not None
    return m.BoardReadRequest(task_id=claim.task.id, fencing_token=claim.token)


def test_a_revoke_through_one_replica_is_refused_by_every_other_at_once(replicas: list[SqlStore],
                                                                        clock: FakeClock) -> None:
    worker = claimed_worker(replicas[0], clock, secret=SECRET)
    planes = [_tools(s, clock) for s in replicas]
    read = _read(replicas[0], worker.worker_id)
    for tools in planes:  # every replica has verified (and cached) the token
        assert tools.board_read(worker.token, read).posts == []
    TokenAuthority(SECRET, replicas[0], clock).revoke(worker.worker_id)
    for tools in planes:
        with pytest.raises(InvalidTokenError, match="revoked"):
            tools.board_read(worker.token, read)


def test_the_plane_rate_limit_binds_across_replicas(replicas: list[SqlStore], clock: FakeClock) -> None:
    worker = claimed_worker(replicas[0], clock, secret=SECRET)
    planes = [_tools(s, clock, rate=1.0, burst=4) for s in replicas]
    read = _read(replicas[0], worker.worker_id)
    served = refused = 0
    for i in range(12):
        try:
            planes[i % 3].board_read(worker.token, read)
            served += 1
        except RateLimitedError as exc:
            refused += 1
            assert exc.retry_after_s > 0
    if replicas[0].single_writer:  # SQLite: one host, one bucket per serving process (documented)
        assert served == 12
    else:
        assert (served, refused) == (4, 8)


def test_the_holds_of_a_replica_that_died_become_unknown(replicas: list[SqlStore], clock: FakeClock) -> None:
    alive, dead = replicas[0], replicas[1]
    alive.register_plane("pln_alive")
    dead.register_plane("pln_dead")
    worker = claimed_worker(alive, clock, secret=SECRET)
    task = alive.current_claim(worker.worker_id)
    assert task is not None
    lost = dead.reserve(task.task.id, task.token, model="m", amount=100, method="bytes")
    kept = alive.reserve(task.task.id, task.token, model="m", amount=50, method="bytes")
    settled = dead.reserve(task.task.id, task.token, model="m", amount=70, method="bytes")
    dead.settle(settled.id, 60)
    clock.advance(20)
    alive.plane_seen("pln_alive")
    assert alive.sweep_dead_planes(30.0) == []  # not dead yet
    clock.advance(20)
    alive.plane_seen("pln_alive")
    assert alive.sweep_dead_planes(30.0) == [lost.id]
    assert alive.get_reservation(lost.id).state is ReservationState.UNKNOWN
    assert alive.get_reservation(kept.id).state is ReservationState.HELD
    assert alive.sweep_dead_planes(30.0) == []  # once
    goal = alive.get_goal(worker.goal_id)
    assert (goal.envelope.reserved, goal.envelope.settled) == (150, 60)  # unknown stays held until reconciled
    # a replica that was only slow settles its call after all: the envelopes move once
    dead.settle(lost.id, 80)
    goal = alive.get_goal(worker.goal_id)
    assert (goal.envelope.reserved, goal.envelope.settled) == (50, 140)


def test_a_resend_of_a_lost_call_is_refused_by_every_replica(replicas: list[SqlStore], clock: FakeClock) -> None:
    from swarmyard.auth.tokens import token_hash
    from swarmyard.errors import DuplicateOfUnknownError

    worker = claimed_worker(replicas[0], clock, secret=SECRET)
    hashed = token_hash(worker.token)
    lost = replicas[0].reserve_for_worker(worker.worker_id, hashed, model="m", amount=100, method="bytes",
                                          body_digest="d1")
    replicas[0].mark_unknown(lost.id)
    before = replicas[0].get_goal(worker.goal_id).envelope
    for other in replicas[1:]:
        with pytest.raises(DuplicateOfUnknownError, match=lost.id):
            other.reserve_for_worker(worker.worker_id, hashed, model="m", amount=100, method="bytes",
                                     body_digest="d1")
    assert replicas[2].get_goal(worker.goal_id).envelope == before  # nothing held, no call counted
    fresh = replicas[1].reserve_for_worker(worker.worker_id, hashed, model="m", amount=100, method="bytes",
                                           body_digest="d2")  # another body is another call
    replicas[1].settle(fresh.id, 10)
    replicas[2].reconcile(lost.id, 40)  # once reconciled, the body may be sent again
    again = replicas[1].reserve_for_worker(worker.worker_id, hashed, model="m", amount=100, method="bytes",
                                           body_digest="d1")
    assert again.state is ReservationState.HELD


def test_a_replica_sweeps_only_after_beating_for_a_whole_grace_period(replicas: list[SqlStore],
                                                                       clock: FakeClock) -> None:
    from swarmyard.plane.replicas import ReplicaWatch

    dead = replicas[1]
    dead.register_plane("pln_gone")
    worker = claimed_worker(replicas[0], clock, secret=SECRET)
    claim = replicas[0].current_claim(worker.worker_id)
    assert claim is not None
    lost = dead.reserve(claim.task.id, claim.token, model="m", amount=100, method="bytes")
    clock.advance(100)  # long gone, but the watch below has only just started: it judges no one yet
    watch = ReplicaWatch(replicas[0], grace_s=30.0, heartbeat_s=3600.0, clock=clock)  # beats: the test's
    watch.start()
    try:
        assert watch.beat() == []
        clock.advance(29)
        assert watch.beat() == []
        clock.advance(1)
        assert watch.beat() == [lost.id]
        assert replicas[2].get_reservation(lost.id).state is ReservationState.UNKNOWN
    finally:
        asyncio.run(watch.aclose())


class _CountedWrites:
    """The store's engine, with its write transactions counted (committed or not)."""

    def __init__(self, store: SqlStore) -> None:
        self.n = 0
        engine = store._e
        inner = engine.write

        def write() -> object:
            self.n += 1
            return inner()

        engine.write = write  # type: ignore[method-assign]


def test_a_rate_token_folded_into_a_write_is_taken_in_that_transaction(replicas: list[SqlStore],
                                                                      clock: FakeClock) -> None:
    store = replicas[0]
    worker = claimed_worker(store, clock, secret=SECRET)
    claim = store.current_claim(worker.worker_id)
    assert claim is not None
    writes = _CountedWrites(store)
    with store.rate_token_folded("wrk_f", 1.0, 2):
        store.post(claim.task.id, claim.token, PostKind.NOTE, "one", author=worker.worker_id)
    assert writes.n == 1  # the post's transaction took the token: no transaction of its own
    with store.rate_token_folded("wrk_f", 1.0, 2):
        store.post(claim.task.id, claim.token, PostKind.NOTE, "two", author=worker.worker_id)
    assert writes.n == 2
    # the bucket is empty: the third call's write is refused with the take, and nothing of it is written
    with pytest.raises(RateLimitedError) as refused, store.rate_token_folded("wrk_f", 1.0, 2):
        store.post(claim.task.id, claim.token, PostKind.NOTE, "three", author=worker.worker_id)
    assert refused.value.retry_after_s == pytest.approx(1.0)
    assert [p.body for p in store.read_board(claim.task.goal_id)] == ["one", "two"]
    assert writes.n == 3  # refused inside the post's transaction: no second try on its own
    clock.advance(1.0)
    assert replicas[1].take_rate_token("wrk_f", 1.0, 2) == 0.0  # the refill was one token: the refusal took none
    assert replicas[1].take_rate_token("wrk_f", 1.0, 2) == pytest.approx(1.0)


def test_a_call_that_commits_no_write_still_takes_its_token(replicas: list[SqlStore], clock: FakeClock) -> None:
    store = replicas[0]
    worker = claimed_worker(store, clock, secret=SECRET)
    claim = store.current_claim(worker.worker_id)
    assert claim is not None
    with store.rate_token_folded("wrk_r", 1.0, 3):  # a read: the take is a write of its own, as the block ends
        store.read_board(claim.task.goal_id)
    # a refused write rolls its take back; the call is still counted
    with pytest.raises(StaleFencingTokenError), store.rate_token_folded("wrk_r", 1.0, 3):
        store.post(claim.task.id, claim.token + 1, PostKind.NOTE, "stale", author=worker.worker_id)
    with store.rate_token_folded("wrk_r", 1.0, 3):
        store.post(claim.task.id, claim.token, PostKind.NOTE, "third", author=worker.worker_id)
    with pytest.raises(RateLimitedError), store.rate_token_folded("wrk_r", 1.0, 3):  # three calls: the burst
        store.read_board(claim.task.goal_id)
    assert [p.body for p in store.read_board(claim.task.goal_id)] == ["third"]


def test_the_plane_makes_one_write_per_tool_call_with_shared_buckets(replicas: list[SqlStore],
                                                                    clock: FakeClock) -> None:
    """A board post through the plane makes as many write transactions as it writes audit events (the post,
    and the lease's renewal when it is due): the shared bucket's take adds none (SQLite keeps its bucket in
    memory: none either)."""
    store = replicas[0]
    worker = claimed_worker(store, clock, secret=SECRET)
    claim = store.current_claim(worker.worker_id)
    assert claim is not None
    tools = _tools(store, clock, rate=1.0, burst=2)
    writes = _CountedWrites(store)
    post = m.BoardPostRequest(task_id=claim.task.id, fencing_token=claim.token, kind=PostKind.NOTE, body="hi")
    for _ in range(2):
        before, events = writes.n, len(store.unsequenced_events(10_000))
        tools.call(lambda: tools.board_post(worker.token, post))
        assert writes.n - before == len(store.unsequenced_events(10_000)) - events >= 1
    before = writes.n
    with pytest.raises(RateLimitedError):  # over its rate at this replica: refused before any store trip
        tools.call(lambda: tools.board_post(worker.token, post))
    assert writes.n == before
    assert len(store.read_board(claim.task.goal_id)) == 2
