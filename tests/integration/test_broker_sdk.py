"""The official OpenAI and Anthropic SDKs against the broker (scripted provider), over real loopback HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import openai
import pytest

from rigs.broker import loopback_broker
from swarmyard.broker import ModelRoute
from swarmyard.broker.app import Broker
from swarmyard.broker.providers.scripted import CallTools, Say, ScriptedProvider
from swarmyard.broker.settings import Tokenizer
from swarmyard.domain import Price, ReservationState
from swarmyard.store import SqlStore


@dataclass
class Rig:
    """A broker on loopback with one claimed task and a worker token."""

    url: str
    store: SqlStore
    script: ScriptedProvider
    token: str
    goal_id: str
    task_id: str
    broker: Broker


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    script = ScriptedProvider()
    routes = (ModelRoute("gpt-test", "scripted", tokenizer=Tokenizer.CL100K, max_output_tokens=1000),
              ModelRoute("claude-test", "scripted", input_per_mtok=3_000_000, output_per_mtok=15_000_000))
    with loopback_broker(f"sqlite:///{tmp_path / 'store.db'}", {"scripted": script}, routes, secret=b"s" * 32,
                         prices=[Price("gpt-test", 1_000_000, 2_000_000)], budget=10_000_000, task_budget=5_000_000,
                         task_call_cap=50) as on:
        worker = on.worker
        yield Rig(on.url, on.store, script, worker.token, worker.goal_id, worker.task_id, on.broker)


def _oa(rig: Rig) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{rig.url}/v1", api_key=rig.token, max_retries=0)


def _an(rig: Rig) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=rig.url, api_key=rig.token, max_retries=0)


def _settled(rig: Rig) -> list[int]:
    assert rig.broker.wait_settled(10)  # settlement is written after the answer went out
    return [r.actual or 0 for r in rig.store.list_reservations(rig.goal_id, state=ReservationState.SETTLED)]


def test_chat_completion_settles_from_reported_usage(rig: Rig) -> None:
    rig.script.add("gpt-test", Say("hello there", input_tokens=100, output_tokens=50))
    reply = _oa(rig).chat.completions.create(model="gpt-test", max_tokens=200,
                                             messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "hello there"
    assert reply.usage is not None and reply.usage.completion_tokens == 50
    # 100 x $1/M + 50 x $2/M = 200 micro-USD
    assert _settled(rig) == [200]
    [reservation] = rig.store.list_reservations(rig.goal_id)
    assert reservation.method.startswith("tiktoken:cl100k_base")
    assert rig.script.requests[-1].max_tokens == 200


def test_chat_streaming_passes_chunks_and_settles(rig: Rig) -> None:
    rig.script.add("gpt-test", Say("streamed words arrive here", output_tokens=4))
    stream = _oa(rig).chat.completions.create(model="gpt-test", stream=True, max_tokens=50,
                                              messages=[{"role": "user", "content": "go"}])
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "streamed words arrive here"
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 3
    assert any(c.usage is not None for c in chunks)
    assert len(_settled(rig)) == 1


def test_stream_without_usage_is_settled_by_counting(rig: Rig) -> None:
    rig.script.add("gpt-test", Say("one two three four five six", report_usage=False))
    list(_oa(rig).chat.completions.create(model="gpt-test", stream=True, max_tokens=50,
                                          messages=[{"role": "user", "content": "go"}]))
    assert rig.broker.wait_settled(10)
    [reservation] = rig.store.list_reservations(rig.goal_id)
    assert reservation.state is ReservationState.SETTLED
    assert reservation.actual is not None and 0 < reservation.actual <= reservation.amount


def test_chat_tool_calls(rig: Rig) -> None:
    rig.script.add("gpt-test", CallTools((("get_weather", {"city": "Paris"}),)))
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    reply = _oa(rig).chat.completions.create(model="gpt-test", tools=tools,  # type: ignore[arg-type]
                                             messages=[{"role": "user", "content": "weather?"}])
    [call] = reply.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    assert reply.choices[0].finish_reason == "tool_calls"


def test_responses_plain_and_streaming(rig: Rig) -> None:
    rig.script.add("gpt-test", Say("plain answer"), Say("streamed answer"))
    client = _oa(rig)
    reply = client.responses.create(model="gpt-test", input="hi", instructions="be brief", max_output_tokens=64)
    assert reply.output_text == "plain answer"
    events = list(client.responses.create(model="gpt-test", input=[{"role": "user", "content": "hi"}],
                                          stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == "streamed answer"
    assert events[-1].type == "response.completed"
    assert rig.script.requests[0].messages[0].content == "be brief"
    assert len(_settled(rig)) == 2


def test_responses_stream_helper_and_function_call(rig: Rig) -> None:
    rig.script.add("gpt-test", CallTools((("shell", {"cmd": "ls"}),)))
    tools = [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}]
    with _oa(rig).responses.stream(model="gpt-test", input="list files", tools=tools) as stream:  # type: ignore[arg-type]
        for _ in stream:
            pass
        final = stream.get_final_response()
    [call] = [item for item in final.output if item.type == "function_call"]
    assert call.name == "shell" and json.loads(call.arguments) == {"cmd": "ls"}


def test_anthropic_messages_plain_streaming_and_tools(rig: Rig) -> None:
    rig.script.add("claude-test", Say("bonjour", input_tokens=10, output_tokens=2), Say("streamed reply"),
                   CallTools((("lookup", {"q": "x"}),), text="let me check"))
    client = _an(rig)
    message = client.messages.create(model="claude-test", max_tokens=100, system="sys",
                                     messages=[{"role": "user", "content": "hi"}])
    assert message.content[0].type == "text" and message.content[0].text == "bonjour"
    assert message.usage.output_tokens == 2
    with client.messages.stream(model="claude-test", max_tokens=100,
                                messages=[{"role": "user", "content": "hi"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "streamed reply" and final.stop_reason == "end_turn"
    tool_msg = client.messages.create(
        model="claude-test", max_tokens=100, messages=[{"role": "user", "content": "look"}],
        tools=[{"name": "lookup", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}])
    blocks = {block.type: block for block in tool_msg.content}
    assert blocks["tool_use"].input == {"q": "x"}  # type: ignore[union-attr]
    assert tool_msg.stop_reason == "tool_use"
    # 10 x $3/M + 2 x $15/M = 60 micro-USD
    assert _settled(rig)[0] == 60


def test_anthropic_tool_results_translate_to_tool_messages(rig: Rig) -> None:
    rig.script.add("claude-test", Say("done"))
    _an(rig).messages.create(model="claude-test", max_tokens=50, messages=[
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "tu_1", "name": "lookup", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "42"}]},
    ])
    messages = rig.script.requests[-1].messages
    assert [m.role.value for m in messages] == ["user", "assistant", "tool"]
    assert messages[2].tool_call_id == "tu_1" and messages[2].content == "42"


def test_count_tokens_and_models(rig: Rig) -> None:
    client = _an(rig)
    counted = client.messages.count_tokens(model="claude-test", messages=[{"role": "user", "content": "héllo"}])
    # byte bound: 6 bytes + one message overhead (8) + request overhead (16)
    assert counted.input_tokens == 30
    ids = sorted(m.id for m in _oa(rig).models.list())
    assert ids == ["claude-test", "gpt-test"]
    assert rig.store.list_reservations(rig.goal_id) == []


def test_missing_max_tokens_gets_the_largest_affordable(rig: Rig) -> None:
    rig.script.add("gpt-test", Say("ok"))
    _oa(rig).chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "hi"}])
    # the task's 5 USD affords far more than the route's cap of 1000
    assert rig.script.requests[-1].max_tokens == 1000
