"""The plane's tool client reads answers strictly: a field of the wrong type or missing is a ``bad_response``, the
claim's fields are filled into later calls, and an error answer is the plane's typed error. The built-in agent's
tools read the posts, findings and scores they act on the same way."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from swarmyard.agents.tools import PlaneTools
from swarmyard.domain import PostKind
from swarmyard.errors import LeaseExpiredError, SwarmyardError
from swarmyard.plane import tool_results as r
from swarmyard.plane.client import (
    Fence,
    ToolCall,
    ToolClient,
    board_post_call,
    board_read_call,
    read_findings_call,
    submit_artifact_call,
)
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


class AsyncScripted:
    """:class:`Scripted` for an async client (the built-in agent's tools)."""

    def __init__(self, *answers: tuple[int, Any]) -> None:
        self.sync = Scripted(*answers)

    async def post(self, url: str, *, json: Any = None) -> Response:
        return self.sync.post(url, json=json)


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


_POST = {"goal_id": "g1", "seq": 3, "kind": "progress", "group": "main", "author": "w1", "task_id": "t1",
         "fencing_token": 7, "body": "halfway", "created_at": 1.0}
_ARTIFACT = {"sha256": "ab" * 32, "goal_id": "g1", "task_id": "t1", "size": 1, "media_type": "text/plain",
             "author": "w1", "created_at": 1.0}


def test_the_agents_tools_give_the_answer_as_sent_and_read() -> None:
    answer = {"post": _POST, "added": "by a newer plane"}
    http = AsyncScripted((200, answer))
    data, read = asyncio.run(PlaneTools(http).answer(board_post_call("halfway", PostKind.PROGRESS)))
    # the model is shown what the plane said; the agent reads the post it names
    assert data == answer
    assert read == r.PostResult(r.parse(r.PostResult, {"post": _POST}).post)
    assert (read.post.seq, read.post.kind) == (3, PostKind.PROGRESS)
    assert http.sync.sent == [("/v1/tools/board_post", {"kind": "progress", "body": "halfway"})]


@pytest.mark.parametrize(("call", "answer"), [
    (board_post_call("halfway"), {"post": {**_POST, "seq": "3"}}),
    (board_read_call(limit=20), {"posts": [_POST, {**_POST, "body": None}], "cursor": 3}),
    (board_read_call(limit=20), {"posts": _POST, "cursor": 3}),
    (read_findings_call(limit=20), {"findings": [{"id": "f1", "title": "t", "body": "b"}], "cursor": None,
                                    "broadcasts": [], "broadcast_cursor": 0}),
    (submit_artifact_call(b"x"), {"artifact": {**_ARTIFACT, "sha256": None}}),
    (submit_artifact_call(b"x"), {"artifact": _ARTIFACT, "score": 7}),  # a score is the evaluator's object
    (submit_artifact_call(b"x"), {"artifact": _ARTIFACT, "direction": {"direction": "proof"}}),
])
def test_a_malformed_answer_to_the_agents_tools_is_a_bad_response(call: ToolCall[Any],
                                                                   answer: dict[str, Any]) -> None:
    with pytest.raises(SwarmyardError) as bad:
        asyncio.run(PlaneTools(AsyncScripted((200, answer))).answer(call))
    assert bad.value.code == "bad_response" and call.result.__name__ in bad.value.message


@pytest.mark.parametrize(("score", "scored"), [
    (None, None), ({"score": 8, "signature": "s"}, 8), ({"score": -2}, -2), ({"score": True}, None),
    ({"score": 8.0}, None), ({"score": "8"}, None), ({"signature": "s"}, None),
])
def test_the_score_read_is_an_integer_as_the_plane_records_it(score: Any, scored: int | None) -> None:
    assert r.parse(r.ArtifactResult, {"artifact": _ARTIFACT, "score": score}).scored == scored
