"""Bad input and refused budgets: a typed 4xx, and no reservation left behind."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from conftest import claimed_worker
from swarmyard.broker import BrokerSettings, ModelRoute, create_broker_app
from swarmyard.broker.providers.scripted import Say, ScriptedProvider
from swarmyard.clock import FakeClock
from swarmyard.store import SqlStore, open_store


@dataclass
class Rig:
    client: TestClient
    store: SqlStore
    script: ScriptedProvider
    clock: FakeClock
    token: str
    goal_id: str
    task_id: str

    def post(self, path: str, body: Any = None, *, content: bytes | None = None,
             token: str | None = None) -> httpx.Response:
        headers = {"authorization": f"Bearer {self.token if token is None else token}"}
        if content is not None:
            return self.client.post(path, content=content, headers=headers)
        return self.client.post(path, json=body, headers=headers)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    clock = FakeClock()
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}", clock=clock)
    worker = claimed_worker(store, clock, secret=b"b" * 32, budget=1_000, call_cap=3, deadline=clock.now() + 60)
    script = ScriptedProvider({"*": [Say("ok")] * 10})
    settings = BrokerSettings(max_body_bytes=10_000, routes=(
        ModelRoute("m", "scripted", input_per_mtok=1_000_000, output_per_mtok=1_000_000, max_output_tokens=4000),
        ModelRoute("small", "scripted", input_per_mtok=1_000, output_per_mtok=1_000, context_tokens=200)))
    with TestClient(create_broker_app(store, worker.tokens, {"scripted": script}, settings, clock)) as client:
        yield Rig(client, store, script, clock, worker.token, worker.goal_id, worker.task_id)
    store.close()


def _msg(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


@pytest.mark.parametrize(("path", "body", "status", "code"), [
    ("/v1/chat/completions", None, 400, "invalid_input"),
    ("/v1/chat/completions", [1, 2], 400, "invalid_input"),
    ("/v1/chat/completions", {"model": 3, "messages": []}, 400, "invalid_input"),
    ("/v1/chat/completions", _msg(max_tokens="ten"), 400, "invalid_input"),
    ("/v1/chat/completions", _msg(max_tokens=10**12), 400, "invalid_input"),
    ("/v1/chat/completions", _msg(stream="yes"), 400, "invalid_input"),
    ("/v1/chat/completions", {**_msg(), "messages": [{"role": "wizard", "content": "x"}]}, 400, "invalid_input"),
    ("/v1/chat/completions", {**_msg(), "model": "nope"}, 404, "not_found"),
    ("/v1/responses", {"model": "m", "input": 5}, 400, "invalid_input"),
    ("/v1/responses", {"model": "m", "input": [{"type": "web_search_call"}]}, 400, "invalid_input"),
    ("/v1/messages", {"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, 400, "invalid_input"),
    ("/v1/messages", {"model": "m", "max_tokens": -1, "messages": [{"role": "user", "content": "x"}]}, 400,
     "invalid_input"),
    ("/v1/messages/count_tokens", {"model": "m"}, 400, "invalid_input"),
])
def test_bad_input_is_a_typed_4xx_and_reserves_nothing(rig: Rig, path: str, body: Any, status: int,
                                                         code: str) -> None:
    response = rig.post(path, content=b"{not json") if body is None else rig.post(path, body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    assert rig.store.list_reservations(rig.goal_id) == []
    assert rig.script.requests == []


def test_oversized_body_is_413(rig: Rig) -> None:
    response = rig.post("/v1/chat/completions", _msg(padding="x" * 20_000))
    assert response.status_code == 413 and response.json()["error"]["code"] == "payload_too_large"
    assert rig.store.list_reservations(rig.goal_id) == []


@pytest.mark.parametrize("token", ["", "sy1.bogus.token", "sk-something"])
def test_bad_token_is_401(rig: Rig, token: str) -> None:
    response = rig.post("/v1/chat/completions", _msg(), token=token)
    assert response.status_code == 401
    assert rig.client.get("/v1/models").status_code == 401
    assert rig.store.list_reservations(rig.goal_id) == []


def test_anthropic_errors_have_the_anthropic_shape(rig: Rig) -> None:
    body = rig.post("/v1/messages", {"model": "nope", "max_tokens": 5, "messages": []}).json()
    assert body["type"] == "error" and body["error"]["type"]


def test_unaffordable_is_402_naming_the_envelope(rig: Rig) -> None:
    # without max_tokens: 1,000 micro-USD affords some output, but not with a huge prompt
    response = rig.post("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x" * 995}]})
    assert response.status_code == 402
    error = response.json()["error"]
    assert error["code"] == "budget_exceeded" and error["envelope"].startswith(("task ", "goal "))
    # an explicit max_tokens over the budget: the store refuses it by name too
    response = rig.post("/v1/chat/completions", _msg(max_tokens=3000))
    assert response.status_code == 402 and "envelope" in response.json()["error"]["message"]
    assert rig.store.list_reservations(rig.goal_id) == []


def test_max_tokens_over_the_route_limit_is_held_at_the_limit(rig: Rig) -> None:
    # Agent CLIs ask for their own large defaults; the broker reserves (and asks for) the route's 4,000 at most,
    # which this 1,000 micro-USD envelope still cannot afford: the refusal names what 4,000 tokens would cost.
    response = rig.post("/v1/chat/completions", _msg(max_tokens=5000))
    assert response.status_code == 402
    assert 4000 <= response.json()["error"]["needed"] < 5000
    assert rig.store.list_reservations(rig.goal_id) == []


def test_affordable_max_tokens_is_computed(rig: Rig) -> None:
    assert rig.post("/v1/chat/completions", _msg()).status_code == 200
    [reservation] = rig.store.list_reservations(rig.goal_id)
    granted = rig.script.requests[0].max_tokens
    assert granted is not None and reservation.amount <= 1_000
    # one more output token would not have fitted
    assert reservation.amount + 1 > 1_000 or granted == 4000


def test_call_cap_is_429_and_deadline_is_403(rig: Rig) -> None:
    for _ in range(3):
        assert rig.post("/v1/chat/completions", _msg(max_tokens=10)).status_code == 200
    capped = rig.post("/v1/chat/completions", _msg(max_tokens=10))
    assert capped.status_code == 429 and capped.json()["error"]["code"] == "call_cap_exceeded"
    assert capped.headers["x-should-retry"] == "false"
    rig.clock.advance(120)
    late = rig.post("/v1/chat/completions", _msg())
    assert late.status_code == 403 and late.json()["error"]["code"] == "deadline_passed"
    assert len(rig.store.list_reservations(rig.goal_id)) == 3


def test_a_conversation_past_the_context_window_is_refused_before_anything_is_held(rig: Rig) -> None:
    # the byte bound counts 300 tokens: no room for an answer in a 200-token window
    for path, body in [
        ("/v1/chat/completions", {"model": "small", "messages": [{"role": "user", "content": "x" * 300}]}),
        ("/v1/messages", {"model": "small", "max_tokens": 10, "messages": [{"role": "user", "content": "x" * 300}]}),
    ]:
        response = rig.post(path, body)
        assert response.status_code == 400 and response.headers["x-should-retry"] == "false"
        error = response.json()["error"]
        assert error.get("code", error.get("type")) in ("context_length_exceeded", "invalid_request_error")
        assert "context window (200 tokens)" in error["message"]
    assert rig.store.list_reservations(rig.goal_id) == []
    assert rig.script.requests == []


def test_max_tokens_is_held_to_what_the_context_window_leaves(rig: Rig) -> None:
    body = {"model": "small", "max_tokens": 500, "messages": [{"role": "user", "content": "x" * 100}]}
    assert rig.post("/v1/chat/completions", body).status_code == 200
    granted = rig.script.requests[0].max_tokens
    [reservation] = rig.store.list_reservations(rig.goal_id)
    # 100 bytes + the per-message and per-request overheads leave 76 of the 200
    assert granted == 76
    assert reservation.amount == -(-(124 * 1_000 + 76 * 1_000) // 1_000_000)
