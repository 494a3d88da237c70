"""The run's scores as the report and the holdout see them, from a real SQLite store: the first artifact to reach
the best search score is the holdout's, times count from the goal's start, workers are named by their rows, and a
holdout already in the store (a resumed run) is never asked for again."""

from __future__ import annotations

from pathlib import Path

from swarmyard.clock import FakeClock
from swarmyard.domain import GoalSpec, TaskSpec
from swarmyard.store import open_store
from swarmyard.swarm.scoring import HoldoutOutcome, RunEvaluator, best_record, run_scores


def test_scores_holdout_pick_and_report_view(tmp_path: Path) -> None:
    clock = FakeClock(1000.0)
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}", clock=clock)
    goal = store.create_goal(GoalSpec("sort", 1_000_000, 100, evaluator=str(tmp_path / "bundle")))
    store.create_task(goal.id, TaskSpec("a"))
    store.create_task(goal.id, TaskSpec("b"))
    first, second = store.claim(goal.id, "wrk_a", 600), store.claim(goal.id, "wrk_b", 600)
    assert first is not None and second is not None
    shas = []
    for claim, data, score in ((first, b"one", 2), (second, b"two", 5), (first, b"three", 5), (second, b"four", 1)):
        clock.advance(10)
        sha = store.put_artifact(claim.task.id, claim.token, data, author=claim.worker_id).sha256
        store.record_score(goal.id, sha, score)
        shas.append(sha)
    records = store.list_scores(goal.id)
    best = best_record(records)
    assert best is not None and (best.sha256, best.worker_id) == (shas[1], "wrk_b")  # first to reach 5
    assert best_record([]) is None

    # nothing scored on the holdout yet and nothing to hand it: the outcome says so without an evaluator
    empty = store.create_goal(GoalSpec("nothing", 1_000_000, 100, evaluator="x"))
    evaluator = RunEvaluator(tmp_path / "bundle", "run_unit")
    assert evaluator.fire_holdout(store, empty) == HoldoutOutcome(None, "no artifact was scored on the search split")
    # a holdout already recorded (the run fired it before a restart) is returned, not asked for again
    done = store.record_score(goal.id, shas[1], 4, split="holdout")
    assert evaluator.fire_holdout(store, store.get_goal(goal.id)) == HoldoutOutcome(done)

    view = run_scores(store, store.get_goal(goal.id), "sort-numbers", {"wrk_a": "worker-0", "wrk_b": "worker-1"},
                      HoldoutOutcome(done))
    assert [(p.at_s, p.score, p.worker) for p in view.search] == [
        (10.0, 2, "worker-0"), (20.0, 5, "worker-1"), (30.0, 5, "worker-0"), (40.0, 1, "worker-1")]
    assert view.holdout is not None
    assert (view.holdout.score, view.holdout.worker, view.holdout.at_s) == (4, "worker-1", 20.0)
    assert [p.sha256 for p in view.best_over_time()] == shas[:2]
    unfinished = run_scores(store, store.get_goal(goal.id), "sort-numbers", {}, None)
    assert unfinished.holdout is None and unfinished.holdout_note == "the run did not reach its end"
    store.close()
