"""Ids in operator API paths, over a real Unix socket on SQLite and PostgreSQL: the server refuses every path
parameter that is not an id (a NUL was a 500 on PostgreSQL), and the CLI refuses, before any request, an id that
would aim its request at another endpoint (``swarmyard task complete 'ID/cancel?'`` cancelled the task)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_plane_tools import Plane, start_plane

from swarmyard.clock import FakeClock
from swarmyard.domain import GoalSpec, TaskSpec, TaskState


@pytest.fixture
def plane(store_url: str, clock: FakeClock) -> Iterator[Plane]:
    yield from start_plane(store_url, clock)


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v1/operator/tasks/%00"),
    ("GET", "/v1/operator/goals/%00"),
    ("GET", "/v1/operator/goals/%00/tasks"),
    ("GET", "/v1/operator/goals/a%00b/workers"),
    ("POST", "/v1/operator/goals/a%00b/workers"),
    ("GET", "/v1/operator/goals/g%20x/board"),
    ("POST", "/v1/operator/workers/%00/revoke"),
    ("POST", "/v1/operator/tasks/%00/cancel"),
    ("POST", "/v1/operator/reservations/%00/reconcile"),
])
def test_a_path_parameter_that_is_no_id_is_a_typed_400(plane: Plane, method: str, path: str) -> None:
    goal = plane.store.create_goal(GoalSpec(objective="o", budget_micro_usd=1000, call_cap=5))
    answer = plane.http.request(method, path, headers={"authorization": f"Bearer {plane.operator}"}, json={})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "invalid_input"
    assert plane.store.list_workers(goal.id) == []  # nothing was registered
    assert plane.http.get("/healthz").status_code == 200


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swarmyard.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_the_cli_refuses_an_id_that_would_aim_elsewhere(plane: Plane, tmp_path: Path) -> None:
    goal = plane.store.create_goal(GoalSpec(objective="o", budget_micro_usd=10_000, call_cap=5))
    task = plane.store.create_task(goal.id, TaskSpec(title="t", budget_micro_usd=1000))
    token, who = plane.tokens.issue(goal.id, "main", ttl_s=3600)
    (tmp_path / "operator-token").write_text(plane.operator + "\n")
    server = ("--server", plane.socket, "--operator-token-file", str(tmp_path / "operator-token"))
    for bad in (f"{task.id}/cancel?", f"{task.id}/cancel#", "..", "."):
        refused = _cli("task", "complete", bad, *server, cwd=tmp_path)
        assert refused.returncode == 1, (bad, refused.stdout, refused.stderr)
        assert refused.stderr.startswith("error (invalid_input): task_id"), (bad, refused.stderr)
    revoke = _cli("worker", "revoke", f"x/../../tasks/{task.id}/cancel?", *server, cwd=tmp_path)
    assert revoke.returncode == 1 and "error (invalid_input): worker_id" in revoke.stderr, revoke.stderr
    listed = _cli("task", "list", f"{goal.id}/tasks?", *server, cwd=tmp_path)
    assert listed.returncode == 1 and "error (invalid_input): goal_id" in listed.stderr, listed.stderr
    after = plane.store.get_task(task.id)
    assert after.state is TaskState.PENDING and after.revision == task.revision  # nothing was cancelled
    assert not plane.store.get_worker(who.worker_id).revoked
    plane.ok("claim_task", token, task_id=task.id)  # and the task is still there to be worked
