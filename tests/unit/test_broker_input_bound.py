"""The input bound counts every byte that may reach the upstream.

Random request bodies (Chat Completions, Messages, Responses) go through the broker's own entry (``parse_object``
and the API format's parser); the bodies the OpenAI-compatible and the Anthropic upstreams would be sent are
serialized as the providers serialize them, and every piece of text in what was serialized is counted, with the
bytes bound and with cl100k: it never comes to more than the bound the broker reserved for. Only the body's skeleton (keys, roles, types, the model name, sampling settings)
is left to the per-message overhead, which stands for the chat template's markers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmyard.broker.chat import ChatRequest, Message, Role, Tool, ToolCall
from swarmyard.broker.formats import ANTHROPIC, OPENAI_CHAT, RESPONSES, anthropic, openai_chat
from swarmyard.broker.jsonbody import parse_object
from swarmyard.broker.tokencount import ByteBoundCounter, TokenCounter, cl100k, input_bound
from swarmyard.errors import InvalidInputError

#: Parts of an upstream body no model reads as text: structure, enumerations and settings.
_SKELETON = frozenset({"model", "role", "type", "stream", "stream_options", "max_tokens", "temperature",
                       "tool_choice", "stop", "stop_sequences"})
#: Objects an upstream renders whole (a schema, a tool call's input): counted as the JSON that was sent.
_WHOLE = frozenset({"parameters", "input_schema", "input"})


def _texts(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _SKELETON:
                continue
            if key in _WHOLE and isinstance(value, dict | list):
                yield orjson.dumps(value).decode()
            else:
                yield from _texts(value)
    elif isinstance(node, list):
        for item in node:
            yield from _texts(item)
    elif isinstance(node, str):
        yield node


def upstream_tokens(sent: bytes, counter: TokenCounter) -> int:
    """The tokens of every piece of text in a serialized upstream body."""
    return sum(counter.count(text) for text in _texts(orjson.loads(sent)) if text)


def sent_bodies(request: ChatRequest) -> list[bytes]:
    """What the two upstream formats would put on the wire (the providers serialize with orjson)."""
    held = replace(request, max_tokens=request.max_tokens or 64)
    return [orjson.dumps(openai_chat.upstream_body(held)), orjson.dumps(anthropic.upstream_body(held))]


_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
_name = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=20)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False)
    | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)
# arguments as agents send them: JSON in any spacing, numbers that an upstream writes longer, or not JSON at all
_arguments = st.one_of(
    _text,
    _json.map(json.dumps),
    _json.map(lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False)),
    st.lists(st.sampled_from(["1e9", "2E5", "-0.0", "1.5e300", "0", "1e-7", "12345678901234"]), max_size=8)
    .map(lambda numbers: "[" + ",".join(numbers) + "]"),
)
_tool_call = st.fixed_dictionaries({
    "id": _name, "type": st.just("function"),
    "function": st.fixed_dictionaries({"name": _name, "arguments": _arguments})})
_message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user"]), "content": _text}),
    st.fixed_dictionaries({"role": st.just("user"), "content": st.lists(
        st.fixed_dictionaries({"type": st.just("text"), "text": _text}), min_size=1, max_size=3)}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": _text | st.none(),
                           "tool_calls": st.lists(_tool_call, max_size=3)}),
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": _name, "content": _text}),
)
_tool = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries({
    "name": _name, "description": _text,
    "parameters": st.dictionaries(_text, _json, max_size=4)})})
chat_bodies = st.fixed_dictionaries({
    "model": st.just("m"), "messages": st.lists(_message, min_size=1, max_size=6),
    "tools": st.lists(_tool, max_size=3), "max_tokens": st.integers(1, 4096)})
_block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": _text}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": _name, "content": _text}),
)
_assistant_block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": _text}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": _name, "name": _name,
                           "input": st.dictionaries(_text, _json, max_size=4)}),
)
messages_bodies = st.fixed_dictionaries({
    "model": st.just("m"), "max_tokens": st.integers(1, 4096), "system": _text,
    "messages": st.lists(st.one_of(
        st.fixed_dictionaries({"role": st.just("user"), "content": _text | st.lists(_block, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"role": st.just("assistant"),
                               "content": st.lists(_assistant_block, min_size=1, max_size=3)}),
    ), min_size=1, max_size=5),
    "tools": st.lists(st.fixed_dictionaries({"name": _name, "description": _text,
                                             "input_schema": st.dictionaries(_text, _json, max_size=4)}),
                      max_size=3)})

_item = st.one_of(
    st.fixed_dictionaries({"type": st.just("message"), "role": st.sampled_from(["system", "developer", "user",
                                                                               "assistant"]), "content": _text}),
    st.fixed_dictionaries({"type": st.just("message"), "role": st.just("user"), "content": st.lists(
        st.fixed_dictionaries({"type": st.just("input_text"), "text": _text}), min_size=1, max_size=3)}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": _name, "name": _name,
                           "arguments": _arguments}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": _name, "output": _text}),
)
responses_bodies = st.fixed_dictionaries({
    "model": st.just("m"), "instructions": _text, "max_output_tokens": st.integers(1, 4096),
    "input": st.lists(_item, min_size=1, max_size=6),
    "tools": st.lists(st.fixed_dictionaries({"type": st.just("function"), "name": _name, "description": _text,
                                             "parameters": st.dictionaries(_text, _json, max_size=4)}),
                      max_size=3)})

COUNTERS = {"bytes": ByteBoundCounter(), "cl100k": cl100k()}


def _check(request: ChatRequest) -> None:
    for name, counter in COUNTERS.items():
        bound = input_bound(request, counter)
        for sent in sent_bodies(request):
            assert upstream_tokens(sent, counter) <= bound, (name, sent)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat_bodies)
def test_no_chat_completions_body_reaches_the_upstream_with_more_tokens_than_its_bound(body: dict[str, Any]) -> None:
    _check(OPENAI_CHAT.parse(parse_object(orjson.dumps(body))))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages_bodies)
def test_no_messages_body_reaches_the_upstream_with_more_tokens_than_its_bound(body: dict[str, Any]) -> None:
    _check(ANTHROPIC.parse(parse_object(orjson.dumps(body))))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(responses_bodies)
def test_no_responses_body_reaches_the_upstream_with_more_tokens_than_its_bound(body: dict[str, Any]) -> None:
    _check(RESPONSES.parse(parse_object(orjson.dumps(body))))


def test_ids_are_counted() -> None:
    # what a 400 kB body held as ~52 tokens was made of
    big = "x" * 400_000
    request = ChatRequest("m", (
        Message(Role.ASSISTANT, "", (ToolCall(big, "f", "{}"),)),
        Message(Role.TOOL, "ok", tool_call_id=big),
    ))
    assert input_bound(request, ByteBoundCounter()) >= 800_000


def test_a_schema_nested_too_deep_to_send_is_a_typed_refusal() -> None:
    deep: dict[str, Any] = {}
    for _ in range(1000):
        deep = {"a": deep}
    request = ChatRequest("m", (Message(Role.USER, "hi"),), (Tool("f", "", deep),))
    with pytest.raises(InvalidInputError) as refused:
        input_bound(request, ByteBoundCounter())
    assert refused.value.field == "tools[0].parameters" and refused.value.status == 400


@pytest.mark.parametrize("arguments", ["[" * 300 + "]" * 300, "not json"])
def test_arguments_no_upstream_body_could_carry_as_json_go_as_text(arguments: str) -> None:
    # Messages wants tool_use.input as an object; what orjson cannot write (past 255 levels) or what is not
    # JSON at all goes whole under _raw, and the bound counts it as it goes
    request = ChatRequest("m", (Message(Role.ASSISTANT, "", (ToolCall("call_1", "f", arguments),)),), max_tokens=8)
    sent = orjson.dumps(anthropic.upstream_body(request))
    [block] = orjson.loads(sent)["messages"][0]["content"]
    assert block["input"] == {"_raw": arguments}
    assert upstream_tokens(sent, ByteBoundCounter()) <= input_bound(request, ByteBoundCounter())
