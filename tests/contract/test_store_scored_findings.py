"""Scores reach findings on SQLite and PostgreSQL: a finding that cites scored artifacts carries the best of their
search scores; one citing none, or only unscored ones, has none; the holdout split never counts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from swarmyard.clock import FakeClock
from swarmyard.domain import Citation, CitationKind, GoalSpec, TaskSpec
from swarmyard.store import SqlStore, open_store


@pytest.fixture
def store(store_url: str, clock: FakeClock) -> Iterator[SqlStore]:
    s = open_store(store_url, clock=clock)
    yield s
    s.close()


def test_a_finding_carries_the_best_search_score_of_the_artifacts_it_cites(store: SqlStore) -> None:
    goal = store.create_goal(GoalSpec("sort", 1_000_000, 100, evaluator="/bundles/sort-numbers")).id
    assert store.get_goal(goal).evaluator == "/bundles/sort-numbers"
    store.create_task(goal, TaskSpec("sorter"))
    claim = store.claim(goal, "w0", 60)
    assert claim is not None
    task, token = claim.task.id, claim.token
    low = store.put_artifact(task, token, b"attempt one", author="w0")
    high = store.put_artifact(task, token, b"attempt two", author="w0")
    unscored = store.put_artifact(task, token, b"attempt three", author="w0")
    store.record_score(goal, low.sha256, 2)
    store.record_score(goal, high.sha256, 4)
    store.record_score(goal, high.sha256, 9, split="holdout")  # the holdout is no search score

    def cite(*shas: str) -> list[Citation]:
        return [Citation(CitationKind.ARTIFACT, sha) for sha in shas]

    both = store.submit_finding(task, token, author="w0", title="t", body="b", citations=cite(low.sha256, high.sha256))
    only_low = store.submit_finding(task, token, author="w0", title="t", body="b", citations=cite(low.sha256))
    none_scored = store.submit_finding(task, token, author="w0", title="t", body="b", citations=cite(unscored.sha256))
    no_cites = store.submit_finding(task, token, author="w0", title="t", body="b")
    assert (both.score, only_low.score, none_scored.score, no_cites.score) == (4, 2, None, None)
    read = {f.id: f.score for f in store.read_findings(goal)}
    assert read == {both.id: 4, only_low.id: 2, none_scored.id: None, no_cites.id: None}


def test_a_finding_that_cited_an_artifact_before_its_score_takes_it_and_the_log_says_so(store: SqlStore) -> None:
    from swarmyard.audit.tables import Ledger, check_tables, parse_body

    goal = store.create_goal(GoalSpec("sort", 1_000_000, 100)).id
    store.create_task(goal, TaskSpec("sorter"))
    claim = store.claim(goal, "w0", 60)
    assert claim is not None
    artifact = store.put_artifact(claim.task.id, claim.token, b"attempt", author="w0")
    other = store.put_artifact(claim.task.id, claim.token, b"another", author="w0")
    early = store.submit_finding(claim.task.id, claim.token, author="w0", title="t", body="b",
                                 citations=[Citation(CitationKind.ARTIFACT, artifact.sha256)])
    bystander = store.submit_finding(claim.task.id, claim.token, author="w0", title="t", body="b",
                                     citations=[Citation(CitationKind.ARTIFACT, other.sha256)])
    assert early.score is None
    store.record_score(goal, artifact.sha256, 3)
    store.record_score(goal, artifact.sha256, 1)  # a lower score later does not lower the finding's
    store.record_score(goal, artifact.sha256, 8, split="holdout")  # nor does the holdout count
    assert {f.id: f.score for f in store.read_findings(goal)} == {early.id: 3, bystander.id: None}
    # the rows still match what the log says of them
    size = store.sequence_events()
    ledger = Ledger()
    for event in store.read_events(0, size):
        assert event.leaf_index is not None
        ledger.add(event.leaf_index, event.kind, parse_body(event, event.leaf_index))
    check_tables(store, ledger)
