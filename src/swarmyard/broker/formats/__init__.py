"""The three API formats behind one small interface the endpoints use."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from swarmyard.broker.chat import ChatRequest, ChatResponse, FinishReason, StreamEvent, Usage
from swarmyard.broker.formats import anthropic, openai_chat, responses
from swarmyard.ids import new_id


class StreamWriter(Protocol):
    """Renders internal stream events as one format's SSE frames."""

    def open(self) -> bytes:
        """Frames before the first event."""
        ...

    def event(self, event: StreamEvent) -> bytes:
        """Frames for one event."""
        ...

    def close(self, finish: FinishReason, usage: Usage) -> bytes:
        """Frames that end the stream."""
        ...

    def error(self, payload: dict[str, Any]) -> bytes:
        """A frame that reports a failure mid-stream."""
        ...


@dataclass(frozen=True, slots=True)
class ApiFormat:
    """How one API format parses requests and renders answers, streams and errors."""

    name: str
    parse: Callable[[dict[str, Any]], ChatRequest]
    render: Callable[[ChatResponse, str, Usage], dict[str, Any]]
    writer: Callable[[str, int], StreamWriter]
    error_body: Callable[[dict[str, Any]], dict[str, Any]]


def _same(payload: dict[str, Any]) -> dict[str, Any]:
    return payload


OPENAI_CHAT = ApiFormat(
    "openai_chat",
    openai_chat.parse_request,
    openai_chat.render_response,
    lambda model, _bound: openai_chat.ChunkWriter(new_id("chatcmpl"), model),
    _same,
)
RESPONSES = ApiFormat(
    "responses",
    responses.parse_request,
    responses.render_response,
    lambda model, _bound: responses.EventWriter(model),
    _same,
)
ANTHROPIC = ApiFormat(
    "anthropic",
    anthropic.parse_request,
    anthropic.render_response,
    lambda model, bound: anthropic.EventWriter(new_id("msg"), model, bound),
    anthropic.error_body,
)
