"""The Store contract, run against SQLite and PostgreSQL: claims, fencing, board, findings, artifacts, ledger."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from swarmyard.canonical import canonical_json
from swarmyard.clock import FakeClock
from swarmyard.domain import (
    Citation,
    CitationKind,
    FindingStatus,
    GoalSpec,
    PostKind,
    Price,
    Quotas,
    ReservationState,
    TaskSpec,
    TaskState,
)
from swarmyard.errors import (
    BudgetExceededError,
    CallCapExceededError,
    DeadlinePassedError,
    DepthExceededError,
    IllegalTransitionError,
    InvalidInputError,
    LeaseExpiredError,
    NotFoundError,
    PayloadTooLargeError,
    QuotaExceededError,
    StaleFencingTokenError,
)
from swarmyard.store import SqlStore, open_store


@pytest.fixture
def store(store_url: str, clock: FakeClock) -> Iterator[SqlStore]:
    s = open_store(store_url, clock=clock, post_limit=1024, artifact_limit=4096)
    yield s
    s.close()


def _goal(store: SqlStore, budget: int = 1_000_000, calls: int = 100, **kw: object) -> str:
    return store.create_goal(GoalSpec("find the answer", budget, calls, **kw)).id  # type: ignore[arg-type]


def _snapshot(store: SqlStore, goal_id: str) -> tuple[object, ...]:
    return (store.get_goal(goal_id), store.list_tasks(goal_id), store.read_board(goal_id),
            store.read_findings(goal_id), store.list_reservations(goal_id))


def test_claim_hands_out_each_task_once_with_increasing_tokens(store: SqlStore) -> None:
    goal = _goal(store)
    ids = {store.create_task(goal, TaskSpec(f"t{i}", budget_micro_usd=1000)).id for i in range(3)}
    claims = [store.claim(goal, f"w{i}", 30) for i in range(4)]
    got = [c for c in claims if c is not None]
    assert {c.task.id for c in got} == ids
    assert [c.token for c in got] == sorted(c.token for c in got)
    assert len({c.token for c in got}) == 3
    assert claims[3] is None


def test_claim_by_id_and_by_group(store: SqlStore) -> None:
    goal = _goal(store)
    a = store.create_task(goal, TaskSpec("a", group="g1"))
    b = store.create_task(goal, TaskSpec("b", group="g2"))
    claim = store.claim(goal, "w", 30, group="g2")
    assert claim is not None and claim.task.id == b.id
    assert store.claim(goal, "w", 30, group="g2") is None
    claim = store.claim(goal, "w", 30, task_id=a.id)
    assert claim is not None and claim.task.id == a.id
    with pytest.raises(NotFoundError):
        store.claim(goal, "w", 30, task_id="task_missing")


def test_expired_lease_makes_task_claimable_and_fences_the_old_holder(store: SqlStore, clock: FakeClock) -> None:
    goal = _goal(store)
    task = store.create_task(goal, TaskSpec("t", budget_micro_usd=10_000))
    first = store.claim(goal, "old", 10)
    assert first is not None
    assert store.claim(goal, "new", 10) is None  # live lease
    clock.advance(10)
    # Token current but lease over: LeaseExpiredError, and nothing is written.
    with pytest.raises(LeaseExpiredError) as info:
        store.post(task.id, first.token, PostKind.NOTE, "late", author="old")
    assert info.value.task_id == task.id and info.value.presented == first.token
    second = store.claim(goal, "new", 10)
    assert second is not None and second.token > first.token
    for write in (
        lambda: store.post(task.id, first.token, PostKind.NOTE, "stale", author="old"),
        lambda: store.renew(task.id, first.token, 10),
        lambda: store.complete(task.id, first.token, "x"),
        lambda: store.fail(task.id, first.token, "x"),
        lambda: store.release(task.id, first.token),
        lambda: store.put_artifact(task.id, first.token, b"stale", author="old"),
        lambda: store.submit_finding(task.id, first.token, author="old", title="t", body="b"),
        lambda: store.reserve(task.id, first.token, model="m", amount=1, method="bytes"),
        lambda: store.delegate(task.id, first.token, TaskSpec("sub")),
    ):
        with pytest.raises(StaleFencingTokenError) as stale:
            write()
        assert stale.value.current == second.token and stale.value.presented == first.token
    assert store.read_board(goal) == []
    assert store.read_findings(goal) == []
    assert store.list_reservations(goal) == []
    assert len(store.list_tasks(goal)) == 1
    store.post(task.id, second.token, PostKind.PROGRESS, "fresh", author="new")
    assert [p.body for p in store.read_board(goal)] == ["fresh"]


def test_renew_release_complete_fail(store: SqlStore, clock: FakeClock) -> None:
    goal = _goal(store)
    t1 = store.create_task(goal, TaskSpec("t1"))
    t2 = store.create_task(goal, TaskSpec("t2"))
    c1 = store.claim(goal, "w", 10, task_id=t1.id)
    assert c1 is not None
    clock.advance(8)
    renewed = store.renew(t1.id, c1.token, 10)
    assert renewed.expires_at == clock.now() + 10
    clock.advance(8)
    store.post(t1.id, c1.token, PostKind.NOTE, "still mine", author="w")
    released = store.release(t1.id, c1.token)
    assert released.state is TaskState.PENDING and released.worker_id is None
    c1b = store.claim(goal, "w", 10, task_id=t1.id)
    assert c1b is not None and c1b.token > c1.token
    done = store.complete(t1.id, c1b.token, "answer")
    assert done.state is TaskState.DONE and done.result == "answer"
    with pytest.raises(LeaseExpiredError):
        store.complete(t1.id, c1b.token, "again")
    c2 = store.claim(goal, "w", 10, task_id=t2.id)
    assert c2 is not None
    assert store.fail(t2.id, c2.token, "boom").state is TaskState.FAILED
    assert store.claim(goal, "w", 10) is None


def test_board_sequence_filters_and_cursor(store: SqlStore) -> None:
    goal = _goal(store)
    t1 = store.create_task(goal, TaskSpec("t1", group="a"))
    t2 = store.create_task(goal, TaskSpec("t2", group="b"))
    c1 = store.claim(goal, "w1", 30, task_id=t1.id)
    c2 = store.claim(goal, "w2", 30, task_id=t2.id)
    assert c1 and c2
    store.post(t1.id, c1.token, PostKind.NOTE, "a1", author="w1")
    store.post(t2.id, c2.token, PostKind.DIRECTION, "b1", author="w2")
    store.post(t1.id, c1.token, PostKind.PROGRESS, "a2", author="w1")
    store.post_as_operator(goal, PostKind.CONSOLIDATION, "all", author="coordinator", group="*")
    posts = store.read_board(goal)
    assert [p.seq for p in posts] == [1, 2, 3, 4]
    assert [p.body for p in store.read_board(goal, group="a")] == ["a1", "a2", "all"]
    assert [p.body for p in store.read_board(goal, after=2)] == ["a2", "all"]
    assert [p.body for p in store.read_board(goal, limit=1, after=1)] == ["b1"]
    assert [p.body for p in store.read_board(goal, kinds=[PostKind.DIRECTION])] == ["b1"]
    assert [p.body for p in store.read_board(goal, author="w1")] == ["a1", "a2"]
    assert posts[0].fencing_token == c1.token and posts[0].task_id == t1.id


def test_findings_citations_must_resolve(store: SqlStore) -> None:
    goal = _goal(store)
    other = _goal(store)
    task = store.create_task(goal, TaskSpec("t"))
    other_task = store.create_task(other, TaskSpec("t"))
    claim = store.claim(goal, "w", 30)
    other_claim = store.claim(other, "w", 30)
    assert claim and other_claim
    post = store.post(task.id, claim.token, PostKind.NOTE, "evidence", author="w")
    art = store.put_artifact(task.id, claim.token, b"data", author="w", media_type="text/plain")
    foreign = store.put_artifact(other_task.id, other_claim.token, b"foreign", author="w")
    first = store.submit_finding(task.id, claim.token, author="w", title="f", body="b",
                                 citations=[Citation(CitationKind.POST, str(post.seq)),
                                            Citation(CitationKind.ARTIFACT, art.sha256)])
    second = store.submit_finding(task.id, claim.token, author="w", title="g", body="c",
                                  citations=[Citation(CitationKind.FINDING, first.id)])
    assert [f.id for f in store.read_findings(goal)] == [first.id, second.id]
    assert [f.id for f in store.read_findings(goal, after=first.id)] == [second.id]
    before = _snapshot(store, goal)
    # past a 64-bit integer (SQLite's binding overflowed: a 500), and what int() takes but is no sequence number
    beyond = [str(2**63), "9" * 23, f" {post.seq}", f"{post.seq} ", f"+{post.seq}", "1_0", "\u0663", "-1"]
    for bad in (Citation(CitationKind.POST, "99"), Citation(CitationKind.POST, "x"),
                *(Citation(CitationKind.POST, ref) for ref in beyond),
                Citation(CitationKind.ARTIFACT, foreign.sha256), Citation(CitationKind.FINDING, "fnd_nope")):
        with pytest.raises(InvalidInputError):
            store.submit_finding(task.id, claim.token, author="w", title="bad", body="b", citations=[bad])
    assert _snapshot(store, goal) == before
    verified = store.set_finding_status(first.id, FindingStatus.VERIFIED, score=7)
    assert verified.status is FindingStatus.VERIFIED and verified.score == 7
    with pytest.raises(IllegalTransitionError):
        store.set_finding_status(first.id, FindingStatus.REJECTED)


def test_artifacts_are_content_addressed(store: SqlStore) -> None:
    goal = _goal(store)
    task = store.create_task(goal, TaskSpec("t"))
    claim = store.claim(goal, "w", 30)
    assert claim
    art = store.put_artifact(task.id, claim.token, b"hello", author="w")
    assert art.sha256 == hashlib.sha256(b"hello").hexdigest()
    assert store.put_artifact(task.id, claim.token, b"hello", author="w") == art
    assert store.read_artifact(goal, art.sha256) == b"hello"
    assert (store.blob_dir / art.sha256[:2] / art.sha256[2:]).read_bytes() == b"hello"
    with pytest.raises(PayloadTooLargeError) as info:
        store.put_artifact(task.id, claim.token, b"x" * 4097, author="w")
    assert info.value.limit == 4096
    with pytest.raises(NotFoundError):
        store.read_artifact(goal, "0" * 64)


def _claimed_tasks(store: SqlStore, goal: str, n: int) -> list[tuple[str, int]]:
    for i in range(n):
        store.create_task(goal, TaskSpec(f"t{i}"))
    claims = [store.claim(goal, f"w{i}", 30) for i in range(n)]
    return [(c.task.id, c.token) for c in claims if c is not None]


def test_artifact_quotas_per_goal_and_per_task_count_each_blob_once(store: SqlStore) -> None:
    goal = _goal(store, quotas=Quotas(artifact_bytes=10_000, task_artifact_bytes=4_000, board_posts=10,
                                      board_bytes=1000))
    (t1, k1), (t2, k2), (t3, k3) = _claimed_tasks(store, goal, 3)
    first = store.put_artifact(t1, k1, b"a" * 3000, author="w0")
    # The same bytes again, from this task or another, are the stored blob: counted once, never refused.
    assert store.put_artifact(t1, k1, b"a" * 3000, author="w0") == first
    assert store.put_artifact(t2, k2, b"a" * 3000, author="w1") == first
    with pytest.raises(QuotaExceededError) as info:
        store.put_artifact(t1, k1, b"b" * 1001, author="w0")  # 3000 + 1001 > the task's 4000
    assert (info.value.code, info.value.status, info.value.what) == ("quota_exceeded", 413, "the task's artifact bytes")
    assert (info.value.used, info.value.size, info.value.limit, info.value.task_id) == (3000, 1001, 4000, t1)
    refused = hashlib.sha256(b"b" * 1001).hexdigest()
    with pytest.raises(NotFoundError):
        store.get_artifact(goal, refused)
    assert not (store.blob_dir / refused[:2] / refused[2:]).exists()  # nothing written for a refused blob
    store.put_artifact(t1, k1, b"b" * 1000, author="w0")  # exactly the task's share
    store.put_artifact(t2, k2, b"c" * 4000, author="w1")
    store.put_artifact(t3, k3, b"d" * 2000, author="w2")  # the goal holds 10000 of its 10000 now
    with pytest.raises(QuotaExceededError) as info:
        store.put_artifact(t3, k3, b"e", author="w2")
    assert (info.value.what, info.value.used, info.value.limit, info.value.goal_id) == (
        "the goal's artifact bytes", 10_000, 10_000, goal)
    assert store.put_artifact(t3, k3, b"d" * 2000, author="w2").size == 2000  # a duplicate still answers
    # Another goal has its own total.
    other = _goal(store, quotas=Quotas(artifact_bytes=10_000))
    ((t4, k4),) = _claimed_tasks(store, other, 1)
    assert store.put_artifact(t4, k4, b"e", author="w3").size == 1


def test_a_goal_without_quotas_in_its_spec_gets_the_store_s(store_url: str, clock: FakeClock) -> None:
    s = open_store(store_url, clock=clock, quotas=Quotas(artifact_bytes=100, task_artifact_bytes=100))
    try:
        goal = _goal(s)
        ((task, token),) = _claimed_tasks(s, goal, 1)
        s.put_artifact(task, token, b"x" * 100, author="w")
        with pytest.raises(QuotaExceededError):
            s.put_artifact(task, token, b"y", author="w")
    finally:
        s.close()


def test_concurrent_artifact_submits_cannot_overshoot_the_goal_quota(store_url: str, clock: FakeClock) -> None:
    """Twelve workers of one goal submit 1000 distinct bytes each at once against a quota of 5500: exactly five
    are stored, the others are refused as over quota, and the goal's total is what was stored."""
    s = open_store(store_url, clock=clock, pool_size=12)
    try:
        goal = _goal(s, quotas=Quotas(artifact_bytes=5500, task_artifact_bytes=5500))
        claimed = _claimed_tasks(s, goal, 12)
        start = threading.Barrier(len(claimed))

        def submit(i: int) -> str:
            task, token = claimed[i]
            start.wait()
            try:
                s.put_artifact(task, token, bytes([i]) * 1000, author=f"w{i}")
            except QuotaExceededError:
                return "refused"
            return "stored"

        with ThreadPoolExecutor(len(claimed)) as pool:
            outcomes = list(pool.map(submit, range(len(claimed))))
        assert sorted(outcomes) == ["refused"] * 7 + ["stored"] * 5
        ((task, token),) = _claimed_tasks(s, goal, 1)
        with pytest.raises(QuotaExceededError) as info:
            s.put_artifact(task, token, b"z" * 501, author="late")
        assert info.value.used == 5000
    finally:
        s.close()


def test_board_quotas_refuse_workers_posts_past_the_count_or_the_bytes(store: SqlStore) -> None:
    goal = _goal(store, quotas=Quotas(board_posts=3, board_bytes=250))
    ((task, token),) = _claimed_tasks(store, goal, 1)
    store.post(task, token, PostKind.NOTE, "x" * 100, author="w")
    with pytest.raises(QuotaExceededError) as info:
        store.post(task, token, PostKind.NOTE, "y" * 151, author="w")
    assert (info.value.what, info.value.used, info.value.size, info.value.limit) == ("the goal's board bytes", 100,
                                                                                        151, 250)
    store.post(task, token, PostKind.NOTE, "y" * 100, author="w")
    store.post(task, token, PostKind.NOTE, "z", author="w")
    with pytest.raises(QuotaExceededError) as info:
        store.post(task, token, PostKind.NOTE, "again", author="w")
    assert (info.value.what, info.value.used, info.value.limit) == ("the goal's board posts", 3, 3)
    # The coordinator's posts are never refused: a worker cannot crowd them out.
    store.post_as_operator(goal, PostKind.NOTE, "consolidated", author="coordinator", group="main")
    assert [p.body[:1] for p in store.read_board(goal)] == ["x", "y", "z", "c"]


def test_ledger_reserve_settle_release_unknown_reconcile(store: SqlStore) -> None:
    goal = _goal(store, budget=10_000, calls=10)
    task = store.create_task(goal, TaskSpec("t", budget_micro_usd=6_000, call_cap=5))
    claim = store.claim(goal, "w", 30)
    assert claim
    store.set_price(Price("m", 1_000_000, 2_000_000))
    assert store.get_price("m").output_per_mtok == 2_000_000
    r1 = store.reserve(task.id, claim.token, model="m", amount=4_000, method="bytes")
    assert store.get_task(task.id).envelope.available == 2_000
    with pytest.raises(BudgetExceededError) as info:
        store.reserve(task.id, claim.token, model="m", amount=2_001, method="bytes")
    assert info.value.envelope.startswith("task") and info.value.available == 2_000
    assert r1.worker_id == "w" and (r1.input_tokens, r1.output_tokens) == (0, 0)
    settled = store.settle(r1.id, 1_500, input_tokens=1_000, output_tokens=250)
    assert settled.state is ReservationState.SETTLED and settled.actual == 1_500
    assert (settled.input_tokens, settled.output_tokens, settled.worker_id) == (1_000, 250, "w")
    assert store.list_reservations(goal)[0].input_tokens == 1_000
    with pytest.raises(InvalidInputError):
        store.settle(r1.id, 1, input_tokens=-1)
    env = store.get_task(task.id).envelope
    assert (env.reserved, env.settled, env.available) == (0, 1_500, 4_500)
    r2 = store.reserve(task.id, claim.token, model="m", amount=1_000, method="bytes")
    store.release_reservation(r2.id)
    assert store.get_task(task.id).envelope.available == 4_500
    r3 = store.reserve(task.id, claim.token, model="m", amount=2_000, method="bytes")
    store.mark_unknown(r3.id)
    assert store.get_goal(goal).envelope.reserved == 2_000
    with pytest.raises(IllegalTransitionError):
        store.mark_unknown(r3.id)
    reconciled = store.reconcile(r3.id, 700)
    assert reconciled.state is ReservationState.SETTLED
    g = store.get_goal(goal).envelope
    assert (g.reserved, g.settled, g.calls) == (0, 2_200, 3)
    with pytest.raises(IllegalTransitionError):
        store.reconcile(r3.id, None)
    # Overage: charged up to the hold, the rest recorded.
    r4 = store.reserve(task.id, claim.token, model="m", amount=100, method="bytes")
    over = store.settle(r4.id, 150)
    assert over.overage == 50 and store.get_task(task.id).envelope.settled == 2_300


def test_call_caps_and_deadline(store: SqlStore, clock: FakeClock) -> None:
    goal = _goal(store, budget=10_000, calls=3, deadline=clock.now() + 100)
    t1 = store.create_task(goal, TaskSpec("t1", budget_micro_usd=5_000, call_cap=2))
    t2 = store.create_task(goal, TaskSpec("t2", budget_micro_usd=5_000))
    c1 = store.claim(goal, "w1", 300, task_id=t1.id)
    c2 = store.claim(goal, "w2", 300, task_id=t2.id)
    assert c1 and c2
    for _ in range(2):
        store.reserve(t1.id, c1.token, model="m", amount=1, method="bytes")
    with pytest.raises(CallCapExceededError) as task_cap:
        store.reserve(t1.id, c1.token, model="m", amount=1, method="bytes")
    assert task_cap.value.envelope.startswith("task")
    store.reserve(t2.id, c2.token, model="m", amount=1, method="bytes")
    with pytest.raises(CallCapExceededError) as goal_cap:
        store.reserve(t2.id, c2.token, model="m", amount=1, method="bytes")
    assert goal_cap.value.envelope.startswith("goal")
    clock.advance(100)
    with pytest.raises(DeadlinePassedError):
        store.reserve(t2.id, c2.token, model="m", amount=1, method="bytes")


def test_envelopes_are_carved(store: SqlStore) -> None:
    goal = _goal(store, budget=1_000, max_depth=1)
    store.create_task(goal, TaskSpec("a", budget_micro_usd=600))
    with pytest.raises(BudgetExceededError):
        store.create_task(goal, TaskSpec("b", budget_micro_usd=401))
    parent = store.create_task(goal, TaskSpec("b", budget_micro_usd=400))
    claim = store.claim(goal, "w", 30, task_id=parent.id)
    assert claim
    child = store.delegate(parent.id, claim.token, TaskSpec("child", budget_micro_usd=300))
    assert child.depth == 1 and child.parent_id == parent.id and child.envelope.limit == 300
    assert store.get_task(parent.id).envelope.limit == 100
    with pytest.raises(BudgetExceededError):
        store.delegate(parent.id, claim.token, TaskSpec("too big", budget_micro_usd=101))
    child_claim = store.claim(goal, "w2", 30, task_id=child.id)
    assert child_claim
    with pytest.raises(DepthExceededError):
        store.delegate(child.id, child_claim.token, TaskSpec("grandchild"))


def test_a_cancelled_task_gives_its_unspent_envelope_back(store: SqlStore) -> None:
    goal = _goal(store, budget=1_000, max_depth=1)
    spent = store.create_task(goal, TaskSpec("spent", budget_micro_usd=600))
    claim = store.claim(goal, "w", 30, task_id=spent.id)
    assert claim
    settled = store.reserve(spent.id, claim.token, model="m", amount=100, method="chat")
    store.settle(settled.id, 70)
    held = store.reserve(spent.id, claim.token, model="m", amount=50, method="chat")
    child = store.delegate(spent.id, claim.token, TaskSpec("child", budget_micro_usd=200))
    assert store.cancel_task(child.id, "not needed").state is TaskState.CANCELLED
    assert store.get_task(spent.id).envelope.limit == 600  # 400 after delegating, and the child's 200 back
    cancelled = store.cancel_task(spent.id, "its machine was deleted")
    assert cancelled.state is TaskState.CANCELLED and cancelled.envelope.limit == 120  # 70 settled + 50 held
    store.settle(held.id, 50)  # a hold in flight still settles inside it
    store.create_task(goal, TaskSpec("again", budget_micro_usd=880))  # 1_000 - 120: the rest is unallocated
    with pytest.raises(BudgetExceededError):
        store.create_task(goal, TaskSpec("over", budget_micro_usd=1))
    with pytest.raises(IllegalTransitionError):
        store.cancel_task(spent.id, "twice")
    with pytest.raises(LeaseExpiredError):  # its claim ended with it
        store.reserve(spent.id, claim.token, model="m", amount=1, method="chat")


@pytest.mark.parametrize("bad", [
    {"budget_micro_usd": -1}, {"budget_micro_usd": 1.5}, {"budget_micro_usd": True}, {"budget_micro_usd": "10"},
    {"call_cap": -1}, {"objective": ""}, {"policy": "chaos"}, {"max_depth": 1.0},
])
def test_bad_goal_specs_are_refused_and_change_nothing(store: SqlStore, bad: dict[str, object]) -> None:
    spec: dict[str, object] = {"objective": "o", "budget_micro_usd": 100, "call_cap": 1, **bad}
    with pytest.raises(InvalidInputError):
        store.create_goal(GoalSpec(**spec))  # type: ignore[arg-type]
    assert store.list_goals() == []


def test_bad_input_is_typed_and_changes_nothing(store: SqlStore) -> None:
    goal = _goal(store, budget=1_000)
    task = store.create_task(goal, TaskSpec("t", budget_micro_usd=500))
    claim = store.claim(goal, "w", 30)
    assert claim
    before = _snapshot(store, goal)
    cases = [
        (NotFoundError, lambda: store.get_goal("goal_nope")),
        (NotFoundError, lambda: store.get_task("task_nope")),
        (NotFoundError, lambda: store.create_task("goal_nope", TaskSpec("t"))),
        (NotFoundError, lambda: store.post_as_operator("goal_nope", PostKind.NOTE, "x", author="a", group="g")),
        (InvalidInputError, lambda: store.reserve(task.id, claim.token, model="m", amount=-5, method="b")),
        (InvalidInputError, lambda: store.reserve(task.id, claim.token, model="m", amount=2.5, method="b")),  # type: ignore[arg-type]
        (InvalidInputError, lambda: store.settle("rsv_x", -1)),
        (NotFoundError, lambda: store.settle("rsv_x", 1)),
        (InvalidInputError, lambda: store.post(task.id, claim.token, "shout", "x", author="w")),  # type: ignore[arg-type]
        (PayloadTooLargeError, lambda: store.post(task.id, claim.token, PostKind.NOTE, "x" * 1025, author="w")),
        (InvalidInputError, lambda: store.post(task.id, "1", PostKind.NOTE, "x", author="w")),  # type: ignore[arg-type]
        (InvalidInputError, lambda: store.create_task(goal, TaskSpec("t", budget_micro_usd=-1))),
        (InvalidInputError, lambda: store.create_task(goal, TaskSpec("t", group="*"))),
        (InvalidInputError, lambda: store.claim(goal, "w", -1)),
        (IllegalTransitionError, lambda: store.release_reservation("rsv_x")) if False else
        (NotFoundError, lambda: store.release_reservation("rsv_x")),
    ]
    for error, call in cases:
        with pytest.raises(error):
            call()
    assert _snapshot(store, goal) == before
    done = store.complete(task.id, claim.token)
    assert done.state is TaskState.DONE
    with pytest.raises(LeaseExpiredError):
        store.renew(task.id, claim.token, 10)


def test_every_write_is_an_audit_event_in_order(store: SqlStore) -> None:
    goal = _goal(store)
    task = store.create_task(goal, TaskSpec("t", budget_micro_usd=10))
    claim = store.claim(goal, "w", 30)
    assert claim
    store.post(task.id, claim.token, PostKind.NOTE, "n", author="w")
    r = store.reserve(task.id, claim.token, model="m", amount=5, method="bytes")
    store.settle(r.id, 3)
    store.record_event("machine.created", {"machine": "m1", "goal": goal})
    assert store.sequence_events() == 7
    kinds = [e.kind for e in store.read_events(0, 100)]
    assert kinds == ["goal.created", "task.created", "task.claimed", "board.posted", "reservation.held",
                     "reservation.settled", "machine.created"]
    assert [e.leaf_index for e in store.read_events(2, 4)] == [2, 3]
    # Every leaf is canonical JSON, including the claim event PostgreSQL splices together in SQL.
    for event in store.read_events(0, 100):
        assert canonical_json(json.loads(event.body)) == event.body
    claimed = json.loads(store.read_events(2, 3)[0].body)
    assert (claimed["task"], claimed["token"], claimed["worker"]) == (task.id, claim.token, "w")
    assert store.sequence_events() == 7  # idempotent


def test_reopening_keeps_everything(store_url: str, clock: FakeClock) -> None:
    first = open_store(store_url, clock=clock)
    goal = _goal(first)
    first.create_task(goal, TaskSpec("t"))
    claim = first.claim(goal, "w", 30)
    first.close()
    second = open_store(store_url, clock=clock)
    assert claim is not None
    task = second.get_task(claim.task.id)
    assert task.state is TaskState.CLAIMED and task.fencing_token == claim.token
    assert second.claim(goal, "x", 30) is None
    second.close()


def test_reserve_for_worker_checks_the_token_and_the_claim_in_its_own_transaction(
        store: SqlStore, clock: FakeClock) -> None:
    from swarmyard.errors import ConflictError, InvalidTokenError

    goal = _goal(store, budget=10_000, calls=10)
    task = store.create_task(goal, TaskSpec("t", budget_micro_usd=6_000, call_cap=2))
    store.add_worker("w", goal, "main", "hash-w", clock.now() + 3600)
    store.add_worker("idle", goal, "main", "hash-idle", clock.now() + 3600)

    def refused(worker: str, token_hash: str, amount: int, error: type[Exception], match: str) -> None:
        before = _snapshot(store, goal)
        with pytest.raises(error, match=match):
            store.reserve_for_worker(worker, token_hash, model="m", amount=amount, method="bytes")
        assert _snapshot(store, goal) == before  # a refusal changes nothing

    refused("w", "hash-w", 100, ConflictError, "holds no live claim")  # nothing claimed yet
    claim = store.claim(goal, "w", 30)
    assert claim is not None
    held = store.reserve_for_worker("w", "hash-w", model="m", amount=4_000, method="bytes")
    assert (held.task_id, held.worker_id, held.amount, held.state) == (task.id, "w", 4_000, ReservationState.HELD)
    assert store.get_task(task.id).envelope.reserved == 4_000 and store.get_goal(goal).envelope.reserved == 4_000
    refused("w", "another-hash", 100, InvalidTokenError, "not the worker's current token")
    refused("nobody", "hash-w", 100, InvalidTokenError, "unknown worker")
    refused("idle", "hash-idle", 100, ConflictError, "holds no live claim")  # another worker's claim is not its
    refused("w", "hash-w", 2_001, BudgetExceededError, f"task {task.id}")
    store.reserve_for_worker("w", "hash-w", model="m", amount=1_000, method="bytes")
    refused("w", "hash-w", 1, CallCapExceededError, f"task {task.id}")  # the task's two calls are used
    store.revoke_worker("w")
    refused("w", "hash-w", 1, InvalidTokenError, "revoked")
    clock.advance(31)
    refused("idle", "hash-idle", 1, ConflictError, "holds no live claim")
    store.sequence_events()
    kinds = [e.kind for e in store.read_events(0, 10_000)]
    assert kinds.count("reservation.held") == 2
