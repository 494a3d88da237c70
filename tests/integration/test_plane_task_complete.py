"""``POST /v1/operator/tasks/{task_id}/complete`` and ``swarmyard task complete``, over a real Unix socket,
against SQLite and PostgreSQL: a task with a finding is completed once (again is ``already_done``), a lapsed
lease is taken back and closed (never redone), and every refusal is typed and changes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from test_plane_tools import Plane, start_plane

from swarmyard.clock import FakeClock
from swarmyard.domain import GoalSpec, TaskSpec, TaskState
from swarmyard.store import open_store

DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.fixture
def plane(store_url: str, clock: FakeClock) -> Iterator[Plane]:
    yield from start_plane(store_url, clock)


def _goal(p: Plane, tasks: int = 1) -> tuple[str, list[str]]:
    goal = p.store.create_goal(GoalSpec(objective="find it", budget_micro_usd=1_000_000, call_cap=100))
    ids = [p.store.create_task(goal.id, TaskSpec(title=f"shard {i}", budget_micro_usd=10_000, call_cap=5)).id
           for i in range(tasks)]
    return goal.id, ids


def _found(p: Plane, goal_id: str, task_id: str) -> tuple[str, dict[str, object]]:
    """A worker claims ``task_id`` and submits a finding for it: its token and its fence."""
    token, _ = p.tokens.issue(goal_id, "main", ttl_s=3600)
    claim = p.ok("claim_task", token, task_id=task_id)
    fence = {"task_id": task_id, "fencing_token": claim["fencing_token"]}
    p.ok("submit_finding", token, **fence, title="the answer", body="it is in shard 3")
    return token, fence


def _complete(p: Plane, task_id: str, *, token: str | None = None, json: object = None,
              content: bytes | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {p.operator if token is None else token}"}
    if content is not None:
        headers["content-type"] = "application/json"
    return p.http.post(f"/v1/operator/tasks/{task_id}/complete", headers=headers, json=json, content=content)


def _events(p: Plane, task_id: str) -> list[tuple[str, dict[str, object]]]:
    """The task's audit events, oldest first."""
    p.store.sequence_events()
    bodies = [(event.kind, json.loads(event.body)) for event in p.store.read_events(0, 100_000)]
    return [(kind, data) for kind, data in bodies if data.get("task") == task_id]


def test_complete_then_again_is_already_done(plane: Plane) -> None:
    goal_id, (task_id,) = _goal(plane)
    _, fence = _found(plane, goal_id, task_id)
    first = _complete(plane, task_id, json={})
    assert first.status_code == 200, first.text
    assert first.json()["outcome"] == "completed"
    done = first.json()["task"]
    assert done["state"] == "done" and done["result"] == "finding submitted"
    assert done["fencing_token"] == fence["fencing_token"]  # closed under the worker's own claim
    # twice in a row (a retry after a lost answer, another replica): a clear no-op, not an error
    again = _complete(plane, task_id)  # no body at all is the empty object
    assert again.status_code == 200, again.text
    assert again.json()["outcome"] == "already_done"
    assert again.json()["task"] == done  # nothing changed, not even the revision
    kinds = [kind for kind, _ in _events(plane, task_id)]
    assert kinds.count("task.completed") == 1 and kinds.count("task.claimed") == 1
    # the route is in the OpenAPI document, with its request and answer
    doc = plane.http.get("/openapi.json").json()
    op = doc["paths"]["/v1/operator/tasks/{task_id}/complete"]["post"]
    assert op["operationId"] == "operator_complete_task"
    assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/CompletionResult")


def test_completions_at_once_close_the_task_once(plane: Plane) -> None:
    goal_id, (task_id,) = _goal(plane)
    _found(plane, goal_id, task_id)
    plane.clock.advance(61)  # each completion finds the lease lapsed and races the others to take it back
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: _complete(plane, task_id, json={}), range(8)))
    assert [a.status_code for a in answers] == [200] * 8, [a.text for a in answers]
    outcomes = [a.json()["outcome"] for a in answers]
    # one closed it (taken back, or completed under a peer's take-back claim); the others found it done
    assert outcomes.count("already_done") == 7 and set(outcomes) - {"already_done"} <= {"taken_back", "completed"}
    kinds = [kind for kind, _ in _events(plane, task_id)]
    assert kinds.count("task.completed") == 1 and kinds.count("task.claimed") == 2


def test_a_lapsed_lease_is_taken_back_and_closed(plane: Plane) -> None:
    goal_id, (task_id,) = _goal(plane)
    token, fence = _found(plane, goal_id, task_id)
    plane.clock.advance(61)  # the lease (60 s) ran out after the finding landed
    answer = _complete(plane, task_id, json={})
    assert answer.status_code == 200, answer.text
    assert answer.json()["outcome"] == "taken_back"
    task = plane.store.get_task(task_id)
    assert task.state is TaskState.DONE and task.worker_id == "operator" and task.attempts == 2
    events = _events(plane, task_id)
    claims = [data for kind, data in events if kind == "task.claimed"]
    assert [c["worker"] for c in claims][-1] == "operator"
    completed = [data for kind, data in events if kind == "task.completed"]
    assert len(completed) == 1 and completed[0]["token"] == claims[-1]["token"] == task.fencing_token
    # the worker whose lease lapsed is refused at its next write: the task is closed, not redone
    late = plane.call("board_post", token, **fence, body="still here")
    assert late.status_code == 409
    assert _complete(plane, task_id).json()["outcome"] == "already_done"


def test_a_task_claimed_again_after_its_lease_lapsed_is_closed_under_that_claim(plane: Plane) -> None:
    goal_id, (task_id,) = _goal(plane)
    _found(plane, goal_id, task_id)
    plane.clock.advance(61)
    second, _ = plane.tokens.issue(goal_id, "main", ttl_s=3600)
    again = plane.ok("claim_task", second, task_id=task_id)  # a second worker set out to redo it
    answer = _complete(plane, task_id, json={})
    assert answer.status_code == 200, answer.text
    assert answer.json()["outcome"] == "completed"
    assert answer.json()["task"]["fencing_token"] == again["fencing_token"]
    assert plane.store.get_task(task_id).state is TaskState.DONE


def test_a_task_with_no_finding_is_refused_and_left_as_it_is(plane: Plane) -> None:
    goal_id, (claimed, pending, failed) = _goal(plane, 3)
    token, _ = plane.tokens.issue(goal_id, "main", ttl_s=3600)
    plane.ok("claim_task", token, task_id=claimed)
    for task_id in (claimed, pending):
        before = plane.store.get_task(task_id)
        answer = _complete(plane, task_id, json={})
        assert answer.status_code == 409, answer.text
        error = answer.json()["error"]
        assert error["code"] == "no_finding" and error["task_id"] == task_id and error["retryable"] is False
        assert plane.store.get_task(task_id) == before
    claim = plane.store.claim(goal_id, "w", 60, task_id=failed)
    assert claim is not None
    plane.store.fail(failed, claim.token, "gave up")
    ended = _complete(plane, failed, json={})
    assert ended.status_code == 409 and ended.json()["error"]["code"] == "illegal_transition"
    assert plane.store.get_task(failed).state is TaskState.FAILED


@pytest.mark.parametrize("task_id", ["a%20b", "x" * 201, "%00", "t%C3%A4sk", "'%3B--", "%E2%80%AE"])
def test_bad_ids_are_refused(plane: Plane, task_id: str) -> None:
    answer = _complete(plane, task_id, json={})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "invalid_input" and answer.json()["error"]["field"] == "task_id"


def test_an_unknown_task_is_404(plane: Plane) -> None:
    answer = _complete(plane, "task_01nonexistent", json={})
    assert answer.status_code == 404
    assert answer.json()["error"] == {"code": "not_found", "message": "task 'task_01nonexistent' not found",
                                      "retryable": False, "kind": "task", "id": "task_01nonexistent"}


def test_a_wrong_token_is_refused_and_changes_nothing(plane: Plane) -> None:
    goal_id, (task_id,) = _goal(plane)
    worker, _ = _found(plane, goal_id, task_id)
    before = plane.store.get_task(task_id)
    missing = plane.http.post(f"/v1/operator/tasks/{task_id}/complete", json={})
    assert missing.status_code == 401
    forged = _complete(plane, task_id, token=plane.operator[:-4] + "AAAA", json={})
    assert forged.status_code == 401 and forged.json()["error"]["code"] == "invalid_token"
    # a worker's token, even the one holding the task, is not an operator's
    as_worker = _complete(plane, task_id, token=worker, json={})
    assert as_worker.status_code == 403 and as_worker.json()["error"]["code"] == "forbidden"
    assert plane.store.get_task(task_id) == before


@pytest.mark.parametrize(("body", "code"), [
    (DEEP, "nesting_too_deep"),
    (b'{"a": ' + DEEP + b"}", "nesting_too_deep"),
    (b'{"result": "mine"}', "invalid_input"),
    (b"[]", "invalid_input"),
    (b"{not json", "invalid_input"),
], ids=["deep-array", "deep-in-object", "unknown-field", "not-an-object", "not-json"])
def test_a_bad_body_is_refused_and_changes_nothing(plane: Plane, body: bytes, code: str) -> None:
    goal_id, (task_id,) = _goal(plane)
    _found(plane, goal_id, task_id)
    before = plane.store.get_task(task_id)
    answer = _complete(plane, task_id, content=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == code
    assert plane.store.get_task(task_id) == before
    assert plane.http.get("/healthz").status_code == 200  # the server is still there


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swarmyard.cli", "task", "complete", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_the_cli_through_the_plane(plane: Plane, tmp_path: Path) -> None:
    goal_id, (task_id, bare) = _goal(plane, 2)
    _found(plane, goal_id, task_id)
    (tmp_path / "operator-token").write_text(plane.operator + "\n")
    server = ("--server", plane.socket, "--operator-token-file", str(tmp_path / "operator-token"))
    done = _cli(task_id, *server, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [task_id, "completed", "(done)"]
    again = _cli(task_id, *server, "--json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    answer = json.loads(again.stdout)
    assert answer["outcome"] == "already_done" and answer["task"]["state"] == "done"
    refused = _cli(bare, *server, cwd=tmp_path)
    assert refused.returncode == 1
    assert refused.stderr.startswith("error (no_finding): ") and bare in refused.stderr
    assert plane.store.get_task(bare).state is TaskState.PENDING
    unknown = _cli("task_01nonexistent", *server, cwd=tmp_path)
    assert unknown.returncode == 1 and "error (not_found)" in unknown.stderr
    (tmp_path / "wrong-token").write_text("sy_op_not-the-token\n")
    wrong = _cli(task_id, "--server", plane.socket, "--operator-token-file", str(tmp_path / "wrong-token"),
                 cwd=tmp_path)
    assert wrong.returncode == 1 and "error (invalid_token)" in wrong.stderr
    no_file = _cli(task_id, "--server", plane.socket, "--operator-token-file", str(tmp_path / "absent"),
                   cwd=tmp_path)
    assert no_file.returncode == 1 and "cannot read the operator token" in no_file.stderr
    usage = _cli(cwd=tmp_path)
    assert usage.returncode == 2 and "TASK_ID" in usage.stderr.upper()


def test_the_cli_on_the_store(store_url: str, tmp_path: Path) -> None:
    store = open_store(store_url, blob_dir=tmp_path / "blobs")
    try:
        goal = store.create_goal(GoalSpec(objective="o", budget_micro_usd=1000, call_cap=5))
        task = store.create_task(goal.id, TaskSpec(title="t"))
        bare = store.create_task(goal.id, TaskSpec(title="no finding"))
        claim = store.claim(goal.id, "w1", 600, task_id=task.id)
        assert claim is not None
        store.submit_finding(task.id, claim.token, author="w1", title="f", body="b")
        first = _cli(task.id, "--store", store_url, cwd=tmp_path)
        assert first.returncode == 0, first.stderr
        assert first.stdout.split() == [task.id, "completed", "(done)"]
        second = _cli(task.id, "--store", store_url, cwd=tmp_path)
        assert second.returncode == 0 and second.stdout.split()[1] == "already_done"
        refused = _cli(bare.id, "--store", store_url, cwd=tmp_path)
        assert refused.returncode == 1 and "error (no_finding)" in refused.stderr
        assert store.get_task(task.id).state is TaskState.DONE
        assert store.get_task(bare.id).state is TaskState.PENDING
    finally:
        store.close()
