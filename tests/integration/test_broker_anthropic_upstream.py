"""The Anthropic upstream provider against a real loopback HTTP server speaking the Messages API."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from swarmyard.broker.chat import ChatRequest, Finished, Message, Role, TextDelta
from swarmyard.broker.keys import Secret
from swarmyard.broker.providers.anthropic import AnthropicProvider
from swarmyard.broker.providers.protocol import CallState
from swarmyard.broker.providers.upstream import Timeouts
from swarmyard.errors import ProviderError, UpstreamLostError

KEY = "sk-ant-upstream-key-0123456789"
_MESSAGE = {"id": "msg_1", "type": "message", "model": "claude-x", "role": "assistant", "stop_reason": "end_turn",
            "content": [{"type": "text", "text": "Hello"}], "usage": {"input_tokens": 7, "output_tokens": 2}}
_EVENTS = [
    {"type": "message_start", "message": {"usage": {"input_tokens": 7}}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
    {"type": "message_stop"},
]


def _answer(path: bytes, body: dict[str, Any]) -> bytes:
    if path == b"/v1/messages" and not body.get("stream"):
        data = json.dumps(_MESSAGE).encode()
        return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(data), data)
    events = _EVENTS if body.get("model") != "cut" else _EVENTS[:3]
    sse = b"".join(b"event: %s\ndata: %s\n\n" % (e["type"].encode(), json.dumps(e).encode()) for e in events)
    if body.get("model") == "busy":
        return b"HTTP/1.1 529 Overloaded\r\ncontent-length: 0\r\n\r\n"
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s" % (len(sse), sse)


def _run(check: Any) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                body = json.loads(await reader.readexactly(length))
                seen.append({"head": head.decode(), "body": body})
                writer.write(_answer(head.split(b" ")[1], body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        provider = AnthropicProvider(f"http://127.0.0.1:{port}", Secret(KEY),
                                     timeouts=Timeouts(connect_s=2, read_s=5, write_s=2))
        try:
            await check(provider)
        finally:
            await provider.aclose()
            server.close()

    asyncio.run(main())
    return seen


def _request(model: str = "claude-x", stream: bool = False) -> ChatRequest:
    return ChatRequest(model, (Message(Role.SYSTEM, "be brief"), Message(Role.USER, "hi")), max_tokens=16,
                       stream=stream)


def test_complete_and_stream_reach_the_upstream_with_the_provider_key() -> None:
    async def check(provider: AnthropicProvider) -> None:
        state = CallState()
        answer = await provider.complete(_request(), state)
        assert state.sent and answer.text == "Hello" and answer.usage is not None
        assert (answer.usage.input_tokens, answer.usage.output_tokens) == (7, 2)
        events = [e async for e in provider.stream(_request(stream=True), CallState())]
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Hello"
        last = events[-1]
        assert isinstance(last, Finished) and last.usage is not None and last.usage.output_tokens == 2

    seen = _run(check)
    assert len(seen) == 2
    assert all(KEY in s["head"] for s in seen)  # the broker's key, in a header, only on the way upstream
    assert seen[0]["body"]["system"] and seen[0]["body"]["max_tokens"] == 16


def test_a_stream_cut_before_message_stop_is_lost_and_an_overload_is_retryable() -> None:
    async def check(provider: AnthropicProvider) -> None:
        with pytest.raises(UpstreamLostError):
            [e async for e in provider.stream(_request("cut", stream=True), CallState())]
        with pytest.raises(ProviderError) as overloaded:
            [e async for e in provider.stream(_request("busy", stream=True), CallState())]
        assert overloaded.value.retryable and KEY not in str(overloaded.value)

    _run(check)
