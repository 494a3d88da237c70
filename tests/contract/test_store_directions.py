"""The store's explore contract on SQLite and PostgreSQL: a direction has at most one live holder, its hold follows
the claim it was taken under, and scores are attributed to worker, direction, group and task."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from swarmyard.clock import FakeClock
from swarmyard.domain import Claim, GoalSpec, TaskSpec
from swarmyard.errors import InvalidInputError, LeaseExpiredError, NotFoundError, StaleFencingTokenError
from swarmyard.store import SqlStore, open_store

DIRECTIONS = ("proof", "disproof", "counterexample")


@pytest.fixture
def store(store_url: str, clock: FakeClock) -> Iterator[SqlStore]:
    s = open_store(store_url, clock=clock, pool_size=12)
    yield s
    s.close()


def _slots(store: SqlStore, n: int, *, lease_s: float = 60.0) -> tuple[str, list[Claim]]:
    goal = store.create_goal(GoalSpec("prove or disprove it", 1_000_000, 100)).id
    store.offer_directions(goal, "explore", DIRECTIONS, patience=3, adopt_margin=10)
    for i in range(n):
        store.create_task(goal, TaskSpec(f"slot {i}", group="explore"))
    claims = [store.claim(goal, f"w{i}", lease_s, group="explore") for i in range(n)]
    assert all(c is not None for c in claims)
    return goal, [c for c in claims if c is not None]


def _holders(store: SqlStore, goal: str) -> dict[str, str | None]:
    return {d.name: d.holder for d in store.list_directions(goal, "explore")}


def test_eight_concurrent_workers_three_directions_never_two_holders(store: SqlStore, clock: FakeClock) -> None:
    goal, claims = _slots(store, 8)
    for round_ in range(5):
        gate = threading.Barrier(len(claims))

        def take(claim: Claim, round_: int = round_, gate: threading.Barrier = gate) -> str | None:
            gate.wait()
            # every worker asks for all three, each starting at a different one
            start = (int(claim.worker_id[1:]) + round_) % 3
            order = DIRECTIONS[start:] + DIRECTIONS[:start]
            taken = store.claim_direction(claim.task.id, claim.token, order, author=claim.worker_id)
            return None if taken is None else taken.name

        with ThreadPoolExecutor(len(claims)) as pool:
            got = list(pool.map(take, claims))
        won = [name for name in got if name is not None]
        assert sorted(won) == sorted(DIRECTIONS), f"round {round_}: {got}"
        holders = _holders(store, goal)
        assert sorted(h for h in holders.values() if h) == sorted(
            c.worker_id for c, name in zip(claims, got, strict=True) if name)
        # the holders' claims end (complete); the next round's racers are new claims on new slots
        for claim, name in zip(claims, got, strict=True):
            if name is not None:
                store.complete(claim.task.id, claim.token)
        assert all(h is None for h in _holders(store, goal).values())
        for i, (claim, name) in enumerate(zip(claims, got, strict=True)):
            if name is not None:
                store.create_task(goal, TaskSpec(f"slot {round_}-{i}", group="explore"))
                again = store.claim(goal, claim.worker_id, 60.0, group="explore")
                assert again is not None
                claims[i] = again


def test_a_hold_lasts_as_long_as_its_claim(store: SqlStore, clock: FakeClock) -> None:
    goal, (a, b) = _slots(store, 2, lease_s=30)
    taken = store.claim_direction(a.task.id, a.token, ["proof"], author="w0")
    assert taken is not None and taken.holder == "w0" and taken.task_id == a.task.id
    assert store.claim_direction(b.task.id, b.token, ["proof"], author="w1") is None
    clock.advance(20)
    store.renew(a.task.id, a.token, 30)  # the hold is renewed with the lease
    store.renew(b.task.id, b.token, 60)
    clock.advance(20)
    assert store.claim_direction(b.task.id, b.token, ["proof"], author="w1") is None
    clock.advance(15)  # a's lease lapsed: so did its hold
    moved = store.claim_direction(b.task.id, b.token, ["proof"], author="w1")
    assert moved is not None and moved.holder == "w1"
    with pytest.raises(LeaseExpiredError):
        store.claim_direction(a.task.id, a.token, ["disproof"], author="w0")
    # taking another direction drops the one held; asking again for the one held keeps it
    again = store.claim_direction(b.task.id, b.token, ["disproof"], author="w1")
    assert again is not None and again.name == "disproof"
    assert _holders(store, goal) == {"proof": None, "disproof": "w1", "counterexample": None}
    kept = store.claim_direction(b.task.id, b.token, ["disproof", "proof"], author="w1")
    assert kept is not None and kept.name == "disproof"
    store.release(b.task.id, b.token)
    assert all(h is None for h in _holders(store, goal).values())


def test_bad_direction_claims_are_typed_and_change_nothing(store: SqlStore) -> None:
    goal, (a, b) = _slots(store, 2)
    assert store.claim_direction(a.task.id, a.token, ["proof"], author="w0") is not None
    before = store.list_directions(goal)
    for names in (["guesswork"], [], [""], ["x" * 300]):
        with pytest.raises(InvalidInputError):
            store.claim_direction(b.task.id, b.token, names, author="w1")
    with pytest.raises(StaleFencingTokenError):
        store.claim_direction(b.task.id, b.token + 1000, ["disproof"], author="w1")
    with pytest.raises(InvalidInputError):
        store.offer_directions(goal, "explore", ["a"], patience=0, adopt_margin=1)
    assert store.list_directions(goal) == before
    settings = store.explore_settings(goal, "explore")
    assert settings is not None and (settings.patience, settings.adopt_margin) == (3, 10)
    assert store.explore_settings(goal, "team") is None


def test_a_group_without_offered_directions_takes_the_names_its_workers_give(store: SqlStore) -> None:
    goal = store.create_goal(GoalSpec("g", 1_000_000, 100)).id
    for i in range(2):
        store.create_task(goal, TaskSpec(f"t{i}", group="free"))
    a = store.claim(goal, "w0", 60, group="free")
    b = store.claim(goal, "w1", 60, group="free")
    assert a is not None and b is not None
    assert store.claim_direction(a.task.id, a.token, ["by induction"], author="w0") is not None
    assert store.claim_direction(b.task.id, b.token, ["by induction"], author="w1") is None
    named = store.claim_direction(b.task.id, b.token, ["by induction", "by contradiction"], author="w1")
    assert named is not None and named.name == "by contradiction" and not named.offered


def test_a_direction_says_whether_any_claim_took_it_and_how_often_it_was_tried(store: SqlStore) -> None:
    goal, (a, b) = _slots(store, 2)
    store.claim_direction(a.task.id, a.token, ["proof"], author="w0")
    for i in range(2):
        art = store.put_artifact(a.task.id, a.token, f"attempt {i}".encode(), author="w0")
        store.record_score(goal, art.sha256, 100 + i)
    store.claim_direction(a.task.id, a.token, ["disproof"], author="w0")  # proof is let go, after two attempts
    store.release(a.task.id, a.token)  # and disproof with the claim, never tried
    seen = {d.name: (d.holder, d.taken, d.attempts) for d in store.list_directions(goal, "explore")}
    # untried by anyone is counted across the run: what a claim once held stays taken after it let go
    assert seen == {"proof": (None, True, 2), "disproof": (None, True, 0), "counterexample": (None, False, 0)}
    held = store.claim_direction(b.task.id, b.token, ["counterexample"], author="w1")
    assert held is not None and (held.holder, held.taken, held.attempts) == ("w1", True, 0)


def test_scores_are_attributed_and_ranked(store: SqlStore) -> None:
    goal, (a, b) = _slots(store, 2)
    store.claim_direction(a.task.id, a.token, ["proof"], author="w0")
    store.claim_direction(b.task.id, b.token, ["disproof"], author="w1")
    arts = [store.put_artifact(c.task.id, c.token, f"attempt {i}".encode(), author=c.worker_id)
            for i, c in enumerate((a, a, b))]
    first = store.record_score(goal, arts[0].sha256, 400)
    assert (first.worker_id, first.direction, first.group, first.task_id) == ("w0", "proof", "explore", a.task.id)
    store.record_score(goal, arts[1].sha256, 250)
    store.record_score(goal, arts[2].sha256, 700)
    assert store.best_scores(goal, by="direction") == {"proof": 400, "disproof": 700}
    assert store.best_scores(goal, by="worker") == {"w0": 400, "w1": 700}
    assert store.best_scores(goal, by="group") == {"explore": 700}
    assert store.best_scores(goal, by="task") == {a.task.id: 400, b.task.id: 700}
    assert [s.score for s in store.list_scores(goal, worker_id="w0")] == [400, 250]
    assert {d.name: d.best_score for d in store.list_directions(goal)} == {
        "proof": 400, "disproof": 700, "counterexample": None}
    with pytest.raises(NotFoundError):
        store.record_score(goal, "0" * 64, 1)
    for bad in (True, 1.5, 2**63):
        with pytest.raises(InvalidInputError):
            store.record_score(goal, arts[0].sha256, bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        store.best_scores(goal, by="model")  # type: ignore[arg-type]
    assert len(store.list_scores(goal)) == 3


def test_a_score_counts_for_whoever_submitted_the_attempt(store: SqlStore) -> None:
    # content-addressed: b's identical attempt is a's artifact row, and still b's attempt on b's direction
    goal, (a, b) = _slots(store, 2)
    store.claim_direction(a.task.id, a.token, ["proof"], author="w0")
    store.claim_direction(b.task.id, b.token, ["disproof"], author="w1")
    art = store.put_artifact(a.task.id, a.token, b"same attempt", author="w0")
    assert store.put_artifact(b.task.id, b.token, b"same attempt", author="w1") == art
    mine = store.record_score(goal, art.sha256, 9, task_id=b.task.id, worker_id="w1")
    assert (mine.worker_id, mine.task_id, mine.direction) == ("w1", b.task.id, "disproof")
    other = store.create_goal(GoalSpec("other", 1_000_000, 10)).id
    for bad in ({"task_id": b.task.id}, {"task_id": "task_nope", "worker_id": "w1"}):
        with pytest.raises((InvalidInputError, NotFoundError)):
            store.record_score(goal, art.sha256, 1, **bad)  # type: ignore[arg-type]
    with pytest.raises(NotFoundError):
        store.record_score(other, art.sha256, 1)
    assert len(store.list_scores(goal)) == 1
