"""The run's evaluator behind a real control plane: a worker's artifact is scored over HTTP with a signature the
plane checks, stored and audit-logged; asking for the holdout split through the worker tools is refused and
spends nothing, so the run's own holdout still fires, once."""

from __future__ import annotations

import base64
import shutil
import sqlite3
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from conftest import LivePlane
from swarmyard.domain import GoalSpec, TaskSpec
from swarmyard.evaluator.process import run_folder
from swarmyard.swarm.scoring import HOLDOUT_SCORED, RunEvaluator

pytestmark = [pytest.mark.bwrap]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "bundles" / "sort-numbers"
SORTER = b"import sys\nprint(' '.join(map(str, sorted(map(int, sys.stdin.read().split())))))\n"


@pytest.fixture
def evaluator() -> Iterator[RunEvaluator]:
    run_id = f"run_plane_test_{id(sys)}"
    shutil.rmtree(run_folder(run_id), ignore_errors=True)
    made = RunEvaluator(EXAMPLE, run_id)
    yield made
    made.close()
    shutil.rmtree(run_folder(run_id), ignore_errors=True)


def test_a_worker_gets_a_verified_score_and_cannot_ask_for_the_holdout(
        evaluator: RunEvaluator, live_plane: Callable[..., LivePlane]) -> None:
    plane = live_plane(evaluator)
    goal = plane.store.create_goal(GoalSpec("sort", 1_000_000, 100, evaluator=str(EXAMPLE)))
    evaluator.start(goal.id)
    plane.store.create_task(goal.id, TaskSpec("sorter"))
    token, me = plane.tokens.issue(goal.id, "main", ttl_s=3600)
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(plane.socket)), base_url="http://plane",
                      headers={"authorization": f"Bearer {token}"}, timeout=60) as http:
        claim = http.post("/v1/tools/claim_task", json={}).json()
        fenced = {"task_id": claim["task"]["id"], "fencing_token": claim["fencing_token"]}
        data = base64.b64encode(SORTER).decode()
        asked = http.post("/v1/tools/submit_artifact", json={**fenced, "data_base64": data, "split": "holdout"})
        assert asked.status_code == 400, asked.text
        assert asked.json()["error"]["field"] == "split"
        scored = http.post("/v1/tools/submit_artifact", json={**fenced, "data_base64": data})
        assert scored.status_code == 200, scored.text
    signed = scored.json()["score"]
    assert (signed["goal"], signed["split"], signed["score"]) == (goal.id, "search", 5)
    [record] = plane.store.list_scores(goal.id)
    assert (record.score, record.worker_id, record.sha256) == (5, me.worker_id, signed["artifact_sha256"])
    assert plane.store.list_scores(goal.id, split="holdout") == []
    # the worker's try spent nothing: the run's holdout fires, once
    outcome = evaluator.fire_holdout(plane.store, goal)
    assert outcome.record is not None and (outcome.record.split, outcome.record.score) == ("holdout", 5)
    assert evaluator.fire_holdout(plane.store, goal) == outcome  # from the store, not asked again
    with sqlite3.connect(plane.folder / "store.db") as db:
        kinds = [str(k) for (k,) in db.execute("SELECT kind FROM events")]
    assert kinds.count(HOLDOUT_SCORED) == 1 and kinds.count("score.issued") == 1
