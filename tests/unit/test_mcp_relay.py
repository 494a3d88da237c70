"""The MCP relay's claim: the launcher's claim is filled into calls, a second claim while one is held answers what
is held, a claim that found nothing keeps the held one, and a claim answer that is no ClaimResult is an error
result (over httpx's own fake transport: the relay's HTTP is httpx)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx

from swarmyard.plane.client import Fence
from swarmyard.plane.mcp_server import Relay

_TASK = {"id": "t2", "goal_id": "g1", "parent_id": None, "depth": 0, "group": "main", "title": "lens", "prompt": "",
         "state": "claimed", "revision": 2, "fencing_token": 9, "worker_id": "w1", "lease_expires_at": 60.0,
         "attempts": 1, "result": None, "created_at": 1.0,
         "envelope": {"limit": 10, "reserved": 0, "settled": 0, "call_cap": 1, "calls": 0}}


class Plane:
    """Answers each tool by a script (status, body) and keeps what each call sent."""

    def __init__(self, answers: dict[str, list[tuple[int, Any]]]) -> None:
        self.answers = answers
        self.sent: list[tuple[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        name = request.url.path.removeprefix("/v1/tools/")
        self.sent.append((name, json.loads(request.content)))
        status, body = self.answers[name].pop(0)
        return httpx.Response(status, json=body)


def _relay(plane: Plane, claim: Fence | None) -> tuple[Relay, httpx.AsyncClient]:
    http = httpx.AsyncClient(transport=httpx.MockTransport(plane), base_url="http://plane")
    return Relay(http, claim), http


def test_a_held_claim_is_filled_in_and_answered_again_instead_of_a_second_claim() -> None:
    plane = Plane({"heartbeat": [(200, {"task_id": "t1", "fencing_token": 4, "lease_expires_at": 9.0})],
                   "board_post": [(200, {"post": {}})]})

    async def session() -> tuple[Any, Any]:
        relay, http = _relay(plane, Fence("t1", 4))
        async with http:
            return await relay.call("claim_task", {}), await relay.call("board_post", {"body": "hi"})

    claimed, posted = anyio.run(session)
    assert claimed == (True, {"task": {"id": "t1"}, "fencing_token": 4, "held": True,
                              "lease": {"task_id": "t1", "fencing_token": 4, "lease_expires_at": 9.0}})
    assert posted[0] is True
    assert plane.sent == [("heartbeat", {"task_id": "t1", "fencing_token": 4}),
                          ("board_post", {"body": "hi", "task_id": "t1", "fencing_token": 4})]


def test_a_lapsed_claim_is_dropped_and_the_new_one_named_after() -> None:
    lapsed = {"error": {"code": "lease_expired", "message": "gone", "retryable": False}}
    plane = Plane({"heartbeat": [(409, lapsed)],
                   "claim_task": [(200, {"task": _TASK, "fencing_token": 9, "lease_expires_at": 60.0}),
                                  (200, {"task": None, "fencing_token": None, "lease_expires_at": None}),
                                  (200, {"task": _TASK, "token": 9})]})

    async def session() -> list[Any]:
        relay, http = _relay(plane, Fence("t1", 4))
        async with http:
            first = await relay.call("claim_task", {})
            named = await relay.call("claim_task", {"task_id": "t3"})  # nothing claimable: t2 stays held
            held = relay.claim
            loose = await relay.call("claim_task", {"task_id": "t4"})
            return [first, named, held, loose, relay.claim]

    first, named, held, loose, after = anyio.run(session)
    assert first[0] is True and first[1]["fencing_token"] == 9
    assert named == (True, {"task": None, "fencing_token": None, "lease_expires_at": None})
    assert held == Fence("t2", 9) == after
    assert loose[0] is False and loose[1]["error"]["code"] == "bad_response"
