"""The plane's tool client reads answers strictly: a field of the wrong type or missing is a ``bad_response``, the
claim's fields are filled into later calls, and an error answer is the plane's typed error."""

from __future__ import annotations

import json
from typing import Any

import pytest

from swarmyard.errors import LeaseExpiredError, SwarmyardError
from swarmyard.plane import tool_results as r
from swarmyard.plane.client import Fence, ToolClient
from swarmyard.plane.lean_client import Response

_TASK = {"id": "t1", "goal_id": "g1", "parent_id": None, "depth": 0, "group": "main", "title": "lens", "prompt": "",
         "state": "claimed", "revision": 2, "fencing_token": 7, "worker_id": "w1", "lease_expires_at": 60.0,
         "attempts": 1, "result": None, "created_at": 1.0,
         "envelope": {"limit": 10, "reserved": 0, "settled": 0, "call_cap": 1, "calls": 0}}


class Scripted:
    """A transport that answers each post with the next scripted (status, body) and keeps what was sent."""

    def __init__(self, *answers: tuple[int, Any]) -> None:
        self.answers = list(answers)
        self.sent: list[tuple[str, Any]] = []

    def post(self, url: str, *, json: Any = None) -> Response:
        self.sent.append((url, json))
        status, body = self.answers.pop(0)
        return Response(status, {}, _dumps(body))


def _dumps(body: Any) -> bytes:
    return json.dumps(body).encode()


def test_a_claim_is_read_typed_and_named_by_the_calls_after_it() -> None:
    http = Scripted((200, {"task": _TASK, "fencing_token": 7, "lease_expires_at": 60.0}),
                    (200, {"task_id": "t1", "fencing_token": 7, "lease_expires_at": 90}))
    tools = ToolClient(http)
    claimed = tools.claim_task(model="m")
    assert claimed.task is not None and claimed.task.envelope.limit == 10 and claimed.fencing_token == 7
    assert tools.fence == Fence("t1", 7)
    beat = tools.heartbeat()
    assert beat == r.HeartbeatResult("t1", 7, 90.0) and isinstance(beat.lease_expires_at, float)
    assert http.sent == [("/v1/tools/claim_task", {"model": "m"}),
                         ("/v1/tools/heartbeat", {"task_id": "t1", "fencing_token": 7})]


@pytest.mark.parametrize("answer", [
    {"task": _TASK, "token": 7, "lease_expires_at": 60.0},  # the loose spelling of the fencing token
    {"task": {**_TASK, "id": None, "task_id": "t1"}, "fencing_token": 7, "lease_expires_at": 60.0},
    {"task": _TASK, "fencing_token": "7", "lease_expires_at": 60.0},
    {"task": {**_TASK, "state": "sleeping"}, "fencing_token": 7, "lease_expires_at": 60.0},
    {"task": _TASK, "fencing_token": True, "lease_expires_at": 60.0},
])
def test_an_answer_that_is_not_the_servers_model_is_a_bad_response(answer: dict[str, Any]) -> None:
    tools = ToolClient(Scripted((200, answer)))
    with pytest.raises(SwarmyardError) as bad:
        tools.claim_task()
    assert bad.value.code == "bad_response" and "ClaimResult" in bad.value.message
    assert tools.fence is None


def test_an_empty_claim_keeps_the_claim_held_and_a_refusal_is_typed() -> None:
    http = Scripted((200, {"task": None, "fencing_token": None, "lease_expires_at": None}),
                    (409, {"error": {"code": "lease_expired", "message": "gone", "retryable": False,
                                     "task_id": "t1"}}))
    tools = ToolClient(http, Fence("t1", 3))
    assert tools.claim_task() == r.ClaimResult(None, None, None)
    assert tools.fence == Fence("t1", 3)
    with pytest.raises(LeaseExpiredError) as refused:
        tools.call("heartbeat", {"task_id": "t1", "fencing_token": 3})
    assert refused.value.details["task_id"] == "t1"
