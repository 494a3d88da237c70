"""A refused worker request renews no lease: replayed against a real ``swarmyard serve`` (real HTTP on its socket,
every call renewing: ``--renew-interval-s 0``), every kind of refusal leaves the claim's lease where it was and
writes no event, while one accepted call, sent the same way, does renew (so the check can fail).

The refusals cover every worker tool route: no token, a forged one, a malformed body, a stale fencing token,
another worker's claim, and each tool's own refusals that come after the claim was checked (a post too large or
of a kind workers may not post, a citation of nothing, a source citation on a task without sources, a sub-task
larger than its parent's envelope, an artifact that is not base64, a claim of a task of another group).
"""

from __future__ import annotations

import base64
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving import Served, served_evaluator, served_with_claim

SORT_NUMBERS = Path(__file__).resolve().parents[2] / "examples" / "bundles" / "sort-numbers"

_FENCED_TOOLS = ("heartbeat", "board_read", "board_post", "submit_finding", "read_findings", "submit_artifact",
                 "claim_direction", "read_directions", "delegate")


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_with_claim("--renew-interval-s", "0", "--lease-s", "600") as s:
        yield s


def _events(s: Served) -> list[tuple[int, str]]:
    with sqlite3.connect(f"file:{s.store}?mode=ro", uri=True) as db:
        return [(int(row[0]), str(row[1])) for row in db.execute("SELECT rowid, kind FROM events ORDER BY rowid")]


def _lease(s: Served) -> float:
    with s.client(s.operator) as op:
        task = op.get(f"/v1/operator/tasks/{s.task_id}").json()["task"]
    assert task["state"] == "claimed" and task["fencing_token"] == s.fencing_token
    return float(task["lease_expires_at"])


def _fenced(s: Served, **extra: Any) -> dict[str, Any]:
    return {"task_id": s.task_id, "fencing_token": s.fencing_token, **extra}


def _refused_requests(s: Served, other_worker: str, other_task: str) -> list[tuple[str, str | None, Any]]:
    """(tool, token, JSON body or raw bytes): each one must be refused."""
    stale = s.fencing_token + 1000
    requests: list[tuple[str, str | None, Any]] = []
    for tool in (*_FENCED_TOOLS, "claim_task"):
        requests += [
            (tool, None, _fenced(s)),
            (tool, s.worker[:-4] + ("AAAA" if not s.worker.endswith("AAAA") else "BBBB"), _fenced(s)),
            (tool, s.worker, b"{not json"),
            (tool, s.worker, {"task_id": s.task_id, "fencing_token": "one", "unknown_field": 1}),
        ]
    for tool in _FENCED_TOOLS:
        requests += [
            (tool, s.worker, {"task_id": s.task_id, "fencing_token": stale, "body": "b", "title": "t",
                              "data_base64": "aGk="}),
            (tool, other_worker, _fenced(s, body="b", title="t", data_base64="aGk=")),
        ]
    requests += [
        ("board_post", s.worker, _fenced(s, body="x" * (1 << 20))),
        ("board_post", s.worker, _fenced(s, body="b", kind="consolidation")),
        ("submit_finding", s.worker, _fenced(s, title="t", body="b",
                                             citations=[{"kind": "post", "ref": "999999", "quote": ""}])),
        ("submit_finding", s.worker, _fenced(s, title="t", body="b",
                                             citations=[{"kind": "source", "ref": "a.py:1", "quote": "x"}])),
        ("delegate", s.worker, _fenced(s, title="sub", budget_micro_usd=10**12)),
        ("submit_artifact", s.worker, _fenced(s, data_base64="not base64!")),
        ("claim_task", s.worker, {"task_id": other_task}),
        ("claim_task", s.worker, {"task_id": "tsk_doesnotexist"}),
    ]
    return requests


def test_every_refused_worker_request_leaves_the_lease_and_the_log_alone(served: Served) -> None:
    s = served
    with s.client(s.operator) as op:
        other_worker = op.post(f"/v1/operator/goals/{s.goal_id}/workers", json={}).json()["token"]
        other_task = op.post(f"/v1/operator/goals/{s.goal_id}/tasks",
                             json={"title": "elsewhere", "group": "other"}).json()["task"]["id"]
    refused = _refused_requests(s, other_worker, other_task)
    lease, events = _lease(s), _events(s)
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(s.folder / "plane.sock")), base_url="http://plane",
                      timeout=60) as client:
        for _replay in range(2):
            for tool, token, body in refused:
                headers = {"authorization": f"Bearer {token}"} if token is not None else {}
                if isinstance(body, bytes):
                    answer = client.post(f"/v1/tools/{tool}", content=body,
                                         headers={**headers, "content-type": "application/json"})
                else:
                    answer = client.post(f"/v1/tools/{tool}", json=body, headers=headers)
                assert answer.status_code >= 400, (tool, body if not isinstance(body, bytes) else "raw",
                                                   answer.text[:300])
                assert _lease(s) == lease, f"{tool} refused with {answer.status_code} renewed the lease: {answer.text}"
        assert _events(s) == events, [kind for _, kind in _events(s)[len(events):]]
        # the same client, an accepted call: it renews (every call does here), so the checks above could fail
        accepted = client.post("/v1/tools/board_read", json=_fenced(s),
                               headers={"authorization": f"Bearer {s.worker}"})
    assert accepted.status_code == 200, accepted.text
    assert _lease(s) > lease
    assert [kind for _, kind in _events(s)[len(events):]] == ["task.renewed"]


@pytest.fixture(scope="module")
def evaluator_of_another_goal() -> Iterator[Path]:
    """``swarmyard evaluator serve`` that answers for another goal only: every score it is asked for is refused."""
    with served_evaluator(SORT_NUMBERS, "--goal", "goal_another") as root:
        yield root


def test_an_artifact_the_evaluator_refuses_or_of_a_split_workers_may_not_score_renews_nothing(
        evaluator_of_another_goal: Path) -> None:
    """A refusal of the evaluator's (here it answers for another goal) or a split other than search refuses the
    whole call: no lease renewed, no artifact stored, no event written. Replayed three times each, with every
    call renewing (--renew-interval-s 0)."""
    with served_with_claim("--renew-interval-s", "0", "--lease-s", "600", "--evaluator-socket",
                           str(evaluator_of_another_goal / "eval.sock")) as s:
        data = base64.b64encode(b"print(1)\n").decode()
        lease, events = _lease(s), _events(s)
        with s.client(s.worker) as worker:
            for _replay in range(3):
                holdout = worker.post("/v1/tools/submit_artifact", json=_fenced(
                    s, data_base64=data, media_type="text/x-python", split="holdout"))
                assert holdout.status_code == 400, holdout.text
                assert holdout.json()["error"]["field"] == "split"
                assert _lease(s) == lease
            assert _events(s) == events, "a refused split wrote an event (or stored the artifact)"
            for _replay in range(3):
                refused = worker.post("/v1/tools/submit_artifact", json=_fenced(
                    s, data_base64=data, media_type="text/x-python"))
                assert refused.status_code == 403, refused.text
                assert _lease(s) == lease, "an artifact the evaluator refused renewed the lease"
            # nothing of it is kept: no artifact row, no artifact.submitted (its replays would fill the quota)
            assert _events(s) == events, [kind for _, kind in _events(s)[len(events):]]
            with sqlite3.connect(f"file:{s.store}?mode=ro", uri=True) as db:
                assert db.execute("SELECT count(*) FROM artifacts").fetchone()[0] == 0
            accepted = worker.post("/v1/tools/board_read", json=_fenced(s))
        assert accepted.status_code == 200, accepted.text
        assert _lease(s) > lease
