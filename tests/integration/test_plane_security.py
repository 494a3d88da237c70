"""Fencing and tokens over real HTTP: stale workers 409, bad tokens 401/403, and nothing of theirs lands."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest
from test_plane_tools import Plane, _goal, start_plane

from swarmyard.auth.tokens import TokenAuthority
from swarmyard.clock import FakeClock
from swarmyard.plane.settings import PlaneSettings


@pytest.fixture
def plane(store_url: str, clock: FakeClock) -> Iterator[Plane]:
    yield from start_plane(store_url, clock, PlaneSettings(lease_s=30, rate_per_s=5, rate_burst=8,
                                                           max_post_bytes=1000, max_body_bytes=50_000))


WRITES: dict[str, dict[str, Any]] = {
    "heartbeat": {},
    "board_post": {"body": "stale news"},
    "submit_finding": {"title": "stale", "body": "stale finding"},
    "submit_artifact": {"data_base64": base64.b64encode(b"stale blob").decode()},
    "delegate": {"title": "stale child"},
    "board_read": {},
    "read_findings": {},
}


def test_stale_worker_is_refused_on_every_tool_and_nothing_lands(plane: Plane) -> None:
    goal_id, tasks = _goal(plane, "main")
    old, old_who = plane.tokens.issue(goal_id, "main", ttl_s=3600)
    new, new_who = plane.tokens.issue(goal_id, "main", ttl_s=3600)
    first = plane.ok("claim_task", old)
    plane.clock.advance(31)  # the lease runs out
    second = plane.ok("claim_task", new, task_id=tasks["main"])
    assert second["fencing_token"] > first["fencing_token"]

    stale = {"task_id": tasks["main"], "fencing_token": first["fencing_token"]}
    for tool, extra in WRITES.items():
        response = plane.call(tool, old, **stale, **extra)
        assert response.status_code == 409, (tool, response.text)
        assert response.json()["error"]["code"] in {"stale_fencing_token", "lease_expired"}

    fresh = {"task_id": tasks["main"], "fencing_token": second["fencing_token"]}
    plane.ok("board_post", new, **fresh, body="fresh news")
    plane.ok("submit_finding", new, **fresh, title="fresh", body="fresh finding")
    plane.ok("delegate", new, **fresh, title="fresh child")
    assert [p.author for p in plane.store.read_board(goal_id)] == [new_who.worker_id]
    assert [f.author for f in plane.store.read_findings(goal_id)] == [new_who.worker_id]
    assert [t.title for t in plane.store.list_tasks(goal_id)] == ["lens main", "fresh child"]
    assert old_who.worker_id not in {p.author for p in plane.store.read_board(goal_id)}


def test_expired_lease_without_reclaim_is_409(plane: Plane) -> None:
    goal_id, tasks = _goal(plane, "main")
    token, _ = plane.tokens.issue(goal_id, "main", ttl_s=3600)
    claim = plane.ok("claim_task", token)
    plane.clock.advance(31)
    response = plane.call("board_post", token, task_id=tasks["main"], fencing_token=claim["fencing_token"],
                          body="late")
    assert response.status_code == 409
    assert plane.store.read_board(goal_id) == []


def _claimed(plane: Plane, group: str = "main") -> tuple[str, str, dict[str, Any]]:
    goal_id, tasks = _goal(plane, group)
    token, _ = plane.tokens.issue(goal_id, group, ttl_s=600)
    claim = plane.ok("claim_task", token)
    return goal_id, token, {"task_id": tasks[group], "fencing_token": claim["fencing_token"]}


def test_forged_expired_revoked_and_missing_tokens_are_401(plane: Plane) -> None:
    goal_id, token, fence = _claimed(plane)
    head, payload, mac = token.split(".")
    forged_mac = f"{head}.{payload}.{'A' if mac[0] != 'A' else 'B'}{mac[1:]}"
    other_authority = TokenAuthority(b"z" * 32, plane.store, plane.clock)
    other_key = other_authority.issue(goal_id, "main", ttl_s=600)[0]
    for bad in (forged_mac, "sy1.garbage", "not-a-token", other_key, plane.operator):
        response = plane.call("board_post", bad, **fence, body="forged")
        assert response.status_code == 401, (bad, response.text)
        assert response.json()["error"]["code"] == "invalid_token"
    missing = plane.call("board_post", None, **fence, body="anonymous")
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"

    revoked = plane.http.post(f"/v1/operator/workers/{token_worker(plane, token)}/revoke",
                              headers={"authorization": f"Bearer {plane.operator}"})
    assert revoked.status_code == 200 and revoked.json()["workers"][0]["revoked"] is True
    assert plane.call("board_post", token, **fence, body="after revoke").status_code == 401

    goal2, token2, fence2 = _claimed(plane)
    plane.clock.advance(601)  # past the token's ttl
    assert plane.call("heartbeat", token2, **fence2).status_code == 401
    assert plane.store.read_board(goal_id) == [] and plane.store.read_board(goal2) == []


def token_worker(plane: Plane, token: str) -> str:
    return plane.tokens.verify(token).worker_id


def test_other_goal_and_other_group_are_403(plane: Plane) -> None:
    goal_a, _, fence_a = _claimed(plane)
    goal_b, _ = _goal(plane, "main")
    token_b, _ = plane.tokens.issue(goal_b, "main", ttl_s=600)
    # B's token on A's task: valid token, wrong goal.
    response = plane.call("board_post", token_b, **fence_a, body="intruder")
    assert response.status_code == 403
    assert plane.call("claim_task", token_b, task_id=fence_a["task_id"]).status_code == 403

    goal_c, tasks_c = _goal(plane, "x", "y")
    tx, _ = plane.tokens.issue(goal_c, "x", ttl_s=600)
    ty, _ = plane.tokens.issue(goal_c, "y", ttl_s=600)
    cy = plane.ok("claim_task", ty)
    # An x worker naming y's task (even with y's fencing token) cannot read or write y's board and findings.
    fence_y = {"task_id": tasks_c["y"], "fencing_token": cy["fencing_token"]}
    for tool, extra in (("board_read", {}), ("read_findings", {}), ("board_post", {"body": "peek"}),
                        ("submit_finding", {"title": "t", "body": "b"})):
        assert plane.call(tool, tx, **fence_y, **extra).status_code == 403, tool
    assert plane.call("claim_task", tx, task_id=tasks_c["y"]).status_code == 403
    # Another worker of the same group cannot use a claim that is not its own.
    ty2, _ = plane.tokens.issue(goal_c, "y", ttl_s=600)
    assert plane.call("board_post", ty2, **fence_y, body="borrowed").status_code == 403
    for goal in (goal_a, goal_b, goal_c):
        assert plane.store.read_board(goal) == []
        assert plane.store.read_findings(goal) == []


def test_bad_input_is_400_naming_the_field(plane: Plane) -> None:
    goal_id, token, fence = _claimed(plane)
    cases = [
        ({**fence, "fencing_token": "seven", "body": "x"}, "fencing_token"),
        ({**fence, "kind": "shout", "body": "x"}, "kind"),
        ({**fence}, "body"),
        ({**fence, "body": "x", "extra": 1}, "extra"),
    ]
    for body, field in cases:
        response = plane.call("board_post", token, **body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["field"] == field
    raw = plane.http.post("/v1/tools/board_post", content=b"{not json",
                          headers={"authorization": f"Bearer {token}"})
    assert raw.status_code == 400
    bad64 = plane.call("submit_artifact", token, **fence, data_base64="***")
    assert bad64.status_code == 400 and bad64.json()["error"]["field"] == "data_base64"
    assert plane.store.read_board(goal_id) == []


def test_size_limits_are_413(plane: Plane) -> None:
    goal_id, token, fence = _claimed(plane)
    assert plane.call("board_post", token, **fence, body="x" * 1001).status_code == 413
    big = plane.call("submit_artifact", token, **fence, data_base64=base64.b64encode(b"x" * 60_000).decode())
    assert big.status_code == 413
    assert big.json()["error"]["code"] == "payload_too_large"
    assert plane.store.read_board(goal_id) == []


def test_rate_limit_is_429_with_retry_after(plane: Plane) -> None:
    goal_id, token, fence = _claimed(plane)  # the claim used 1 of the burst of 8
    statuses = [plane.call("board_read", token, **fence).status_code for _ in range(9)]
    assert statuses[:7] == [200] * 7 and statuses[7:] == [429, 429]
    limited = plane.call("board_read", token, **fence)
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    assert limited.json()["error"]["retryable"] is True
    plane.clock.advance(1)  # 5 calls/s refill
    assert plane.call("board_read", token, **fence).status_code == 200
    # another worker is not slowed by this one
    other, _ = plane.tokens.issue(goal_id, "main", ttl_s=600)
    assert plane.call("claim_task", other).status_code == 200
