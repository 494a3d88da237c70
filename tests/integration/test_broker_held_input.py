"""What the broker holds for a call covers every byte that may reach the upstream, over real HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from rigs.broker import loopback_broker
from swarmyard.broker import ModelRoute
from swarmyard.broker.app import Broker
from swarmyard.broker.providers.scripted import CallTools, Say, ScriptedProvider
from swarmyard.store import SqlStore


@dataclass
class Rig:
    url: str
    store: SqlStore
    goal_id: str
    headers: dict[str, str]
    broker: Broker
    script: ScriptedProvider


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    script = ScriptedProvider({"*": [Say("ok", input_tokens=5, output_tokens=1)] * 5})
    route = ModelRoute("m", "scripted", input_per_mtok=1_000_000, output_per_mtok=1_000_000)
    with loopback_broker(f"sqlite:///{tmp_path / 'store.db'}", {"scripted": script}, [route], secret=b"h" * 32,
                         budget=10_000_000, call_cap=100) as on:
        yield Rig(on.url, on.store, on.worker.goal_id, {"authorization": f"Bearer {on.worker.token}"}, on.broker,
                  script)


def test_a_body_of_tool_ids_is_held_for_its_size(rig: Rig) -> None:
    big = "c" * 200_000
    body: dict[str, Any] = {"model": "m", "max_tokens": 10, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": big, "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": big, "content": "done"},
    ]}
    answered = httpx.post(f"{rig.url}/v1/chat/completions", json=body, headers=rig.headers, timeout=30)
    assert answered.status_code == 200, answered.text
    assert rig.broker.wait_settled(10)
    [held] = rig.store.list_reservations(rig.goal_id)
    # 1 micro-USD a token, and a token is at least a byte: both 200 kB ids are in the worst case
    assert held.amount >= 400_000 + 10
    counted = httpx.post(f"{rig.url}/v1/messages/count_tokens", headers=rig.headers, timeout=30, json={
        "model": "m", "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": big, "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": big, "content": "done"}]}]})
    assert counted.status_code == 200 and counted.json()["input_tokens"] >= 400_000


def test_a_schema_nested_1000_deep_is_a_typed_400_that_holds_nothing(rig: Rig) -> None:
    schema = '{"a":' * 1000 + "{}" + "}" * 1000
    raw = ('{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}],'
           '"tools":[{"type":"function","function":{"name":"f","parameters":' + schema + "}}]}")
    answered = httpx.post(f"{rig.url}/v1/chat/completions", content=raw, timeout=30,
                          headers={**rig.headers, "content-type": "application/json"})
    assert answered.status_code == 400, answered.text
    assert answered.json()["error"]["retryable"] is False
    assert rig.store.list_reservations(rig.goal_id) == []
    assert rig.script.requests == []
    # the broker still serves
    ok = httpx.post(f"{rig.url}/v1/chat/completions", headers=rig.headers, timeout=30,
                    json={"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})
    assert ok.status_code == 200


def test_an_answer_nested_deeper_than_a_body_may_be_is_delivered_and_settled(rig: Rig) -> None:
    # a small model can write [[[[... for ever; the worker's Messages answer carries it as text, not a 500
    deep: dict[str, Any] = {}
    for _ in range(300):
        deep = {"a": deep}
    rig.script.add("m", CallTools((("f", deep),)))
    answered = httpx.post(f"{rig.url}/v1/messages", headers=rig.headers, timeout=30, json={
        "model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})
    assert answered.status_code == 200, answered.text
    [block] = answered.json()["content"]
    assert block["type"] == "tool_use" and block["input"]["_raw"].startswith('{"a": {"a":')
    assert rig.broker.wait_settled(10)
    assert [r.state.value for r in rig.store.list_reservations(rig.goal_id)] == ["settled"]
