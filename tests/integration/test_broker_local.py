"""The SDKs against the broker in front of the embedded local model (SmolLM2, loaded once for the module).

The provider is built as a run builds it, from a providers table that names the model (``kind = "local"``,
``models = ["smollm2-135m-instruct"]``); the broker's route is the test's own (priced, and silent on the window).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import openai
import pytest

from conftest import claimed_worker
from loopback import serve_in_thread
from swarmyard.broker import BrokerSettings, ModelRoute, create_broker_app
from swarmyard.broker.app import Broker
from swarmyard.broker.providers.configured import LocalSlots, build
from swarmyard.broker.providers.local import SMOLLM2_SHA256, LocalProvider, ModelFile
from swarmyard.broker.settings import Tokenizer
from swarmyard.clock import FakeClock
from swarmyard.config import ProviderConfig, ProviderKind
from swarmyard.domain import ReservationState
from swarmyard.errors import ConfigError
from swarmyard.store import SqlStore, open_store

pytestmark = [pytest.mark.model, pytest.mark.slow]


@dataclass
class Rig:
    url: str
    store: SqlStore
    token: str
    goal_id: str
    broker: Broker


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    clock = FakeClock()
    folder = tmp_path_factory.mktemp("local")
    store = open_store(f"sqlite:///{folder / 'store.db'}", clock=clock)
    worker = claimed_worker(store, clock, secret=b"l" * 32)
    table = {"local": ProviderConfig(kind=ProviderKind.LOCAL, models=("smollm2-135m-instruct",))}
    providers, (route,) = build(table, cache_dir=folder / "cache", env={}, local_slots=LocalSlots(2, 1024))
    provider = providers["local"]
    assert isinstance(provider, LocalProvider) and provider.model.sha256 == SMOLLM2_SHA256
    assert (route.name, route.tokenizer, route.context_tokens) == ("smollm2-135m-instruct", Tokenizer.PROVIDER, 1024)
    settings = BrokerSettings(routes=(ModelRoute("local", "local", tokenizer=Tokenizer.PROVIDER,
                                                 input_per_mtok=100, output_per_mtok=100, max_output_tokens=256),))
    app = create_broker_app(store, worker.tokens, {"local": provider}, settings, clock)
    with serve_in_thread(app) as url:
        yield Rig(url, store, worker.token, worker.goal_id, app.state.broker)
    store.close()


def test_openai_chat_plain_and_streaming(rig: Rig) -> None:
    client = openai.OpenAI(base_url=f"{rig.url}/v1", api_key=rig.token, max_retries=0)
    reply = client.chat.completions.create(model="local", max_tokens=8,
                                           messages=[{"role": "user", "content": "Say hello."}])
    assert reply.choices[0].message.content
    assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 8
    chunks = list(client.chat.completions.create(model="local", max_tokens=8, stream=True,
                                                 messages=[{"role": "user", "content": "Count to three."}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    methods = {r.method for r in rig.store.list_reservations(rig.goal_id)}
    assert any(m.startswith("llama.cpp:smollm2-135m:sha256=") for m in methods)


def test_anthropic_and_responses_reach_the_local_model(rig: Rig) -> None:
    an = anthropic.Anthropic(base_url=rig.url, api_key=rig.token, max_retries=0)
    message = an.messages.create(model="local", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
    assert message.content and message.content[0].type == "text"
    with an.messages.stream(model="local", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]) as stream:
        assert "".join(stream.text_stream)
    oa = openai.OpenAI(base_url=f"{rig.url}/v1", api_key=rig.token, max_retries=0)
    response = oa.responses.create(model="local", input="Say hi", max_output_tokens=8)
    assert response.output_text
    events = list(oa.responses.create(model="local", input="Say hi", max_output_tokens=8, stream=True))
    assert events[-1].type in ("response.completed", "response.incomplete")


def test_tool_calls_come_back_as_proper_blocks(rig: Rig) -> None:
    tool = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    oa = openai.OpenAI(base_url=f"{rig.url}/v1", api_key=rig.token, max_retries=0)
    reply = oa.chat.completions.create(
        # greedy and with room to close the JSON: sampled, a 0.5B model now and then rambles past 60 tokens
        model="local", max_tokens=200, temperature=0, tool_choice="required",
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": tool}}],
        messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    [call] = reply.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert isinstance(json.loads(call.function.arguments)["city"], str)  # type: ignore[union-attr]
    an = anthropic.Anthropic(base_url=rig.url, api_key=rig.token, max_retries=0)
    message = an.messages.create(
        model="local", max_tokens=200, extra_body={"temperature": 0}, tool_choice={"type": "any"},
        tools=[{"name": "get_weather", "input_schema": tool}],
        messages=[{"role": "user", "content": "Weather in Oslo?"}])
    assert [b.type for b in message.content] == ["tool_use"] and message.stop_reason == "tool_use"
    assert rig.broker.wait_settled(10)  # settlement is written after the answer went out
    assert all(r.state is ReservationState.SETTLED for r in rig.store.list_reservations(rig.goal_id))


def test_a_model_file_with_the_wrong_hash_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"GGUF not really")
    with pytest.raises(ConfigError):
        LocalProvider(ModelFile("fake", fake, SMOLLM2_SHA256))


def test_a_prompt_past_the_slot_context_is_a_typed_400_and_holds_nothing(rig: Rig) -> None:
    # this route does not tell the broker its window: llama.cpp's own refusal comes back typed
    before = {r.id for r in rig.store.list_reservations(rig.goal_id)}
    oa = openai.OpenAI(base_url=f"{rig.url}/v1", api_key=rig.token, max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        oa.chat.completions.create(model="local", max_tokens=8,
                                   messages=[{"role": "user", "content": "word " * 1500}])
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "context_length_exceeded"
    assert body["context_tokens"] == 1024 and body["input_tokens"] > 1024
    new = [r for r in rig.store.list_reservations(rig.goal_id) if r.id not in before]
    assert [r.state for r in new] == [ReservationState.RELEASED]


def test_tools_whose_parameters_refer_to_their_own_defs_are_served(rig: Rig) -> None:
    """MCP servers' tool schemas (pydantic's) use ``$ref`` into their own ``$defs``: several such tools in one
    request reach the model, each answered with arguments of its own schema (Claude Code sends them so)."""
    kind = {"$defs": {"Kind": {"type": "string", "enum": ["note", "question"]}},
            "type": "object", "properties": {"kind": {"$ref": "#/$defs/Kind"}, "body": {"type": "string"}},
            "required": ["kind", "body"]}
    other = {"$defs": {"Unit": {"type": "string", "enum": ["c", "f"]}},
             "type": "object", "properties": {"unit": {"$ref": "#/$defs/Unit"}}, "required": ["unit"]}
    oa = openai.OpenAI(base_url=f"{rig.url}/v1", api_key=rig.token, max_retries=0)
    reply = oa.chat.completions.create(
        model="local", max_tokens=200, temperature=0, tool_choice={"type": "function", "function": {"name": "post"}},
        tools=[{"type": "function", "function": {"name": "post", "parameters": kind}},
               {"type": "function", "function": {"name": "weather", "parameters": other}}],
        messages=[{"role": "user", "content": "Post a note saying hello."}])
    [call] = reply.choices[0].message.tool_calls or []
    assert call.function.name == "post"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments)["kind"] in ("note", "question")  # type: ignore[union-attr]
