"""A provider that answers from a script: per model, a list of replies (text, tool calls, failures).

Shipped in the package so every part of swarmyard can test against the broker without a model or a network.
Replies are used in order; the key ``"*"`` serves models without a script of their own. In a reply's text and
in its tool calls' string arguments, ``{{last_message}}`` stands for the text of the request's last message (an
agent's latest tool result, say): so a script can act as an oracle that runs commands and reports what they
printed, whatever machine it runs in.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from swarmyard.broker.chat import (
    ChatRequest,
    ChatResponse,
    Finished,
    FinishReason,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStart,
    Usage,
)
from swarmyard.broker.providers.protocol import CallState
from swarmyard.broker.tokencount import TokenCounter
from swarmyard.errors import ProviderError, UpstreamLostError
from swarmyard.ids import new_id


@dataclass(frozen=True, slots=True)
class Say:
    """Answer with text; usage is reported unless ``report_usage`` is False (then the broker counts)."""

    text: str
    output_tokens: int | None = None
    input_tokens: int | None = None
    report_usage: bool = True


@dataclass(frozen=True, slots=True)
class CallTools:
    """Answer with tool calls: ``(name, arguments)`` pairs.

    A name ``*suffix`` calls the request's tool whose name ends with ``suffix``: an agent CLI names the tools of an
    MCP server its own way (``mcp__swarmyard__submit_finding``, ``swarmyard_submit_finding``), and one script
    serves them all. No such tool in the request fails the call.
    """

    calls: tuple[tuple[str, Mapping[str, Any]], ...]
    text: str = ""


class FailKind(StrEnum):
    """How a scripted call fails."""

    BEFORE_SEND = "before_send"
    AFTER_SEND = "after_send"
    MID_STREAM = "mid_stream"
    STATUS_500 = "status_500"
    STATUS_429 = "status_429"


@dataclass(frozen=True, slots=True)
class Fail:
    """Fail the call; ``MID_STREAM`` sends ``text`` first, then drops."""

    kind: FailKind
    text: str = ""


Reply = Say | CallTools | Fail


def _tool_name(name: str, request: ChatRequest) -> str:
    if not name.startswith("*"):
        return name
    offered = [t.name for t in request.tools if t.name.endswith(name[1:])]
    if len(offered) != 1:
        raise ProviderError(f"scripted tool call {name}: the request offers {len(offered)} tools ending so "
                            f"({', '.join(t.name for t in request.tools) or 'none'})", retryable=False)
    return offered[0]


def _words(text: str) -> int:
    return max(1, len(text.split()))


#: What a scripted reply's text and string arguments may hold, replaced when the reply is used.
LAST_MESSAGE = "{{last_message}}"


def _fill(value: Any, last: str) -> Any:
    if isinstance(value, str):
        return value.replace(LAST_MESSAGE, last)
    if isinstance(value, list | tuple):
        return [_fill(item, last) for item in value]
    if isinstance(value, Mapping):
        return {key: _fill(item, last) for key, item in value.items()}
    return value


def _filled(reply: Reply, request: ChatRequest) -> Reply:
    """``reply`` with ``{{last_message}}`` replaced by the text of the request's last message."""
    last = request.messages[-1].content if request.messages else ""
    if isinstance(reply, Say) and LAST_MESSAGE in reply.text:
        return replace(reply, text=_fill(reply.text, last))
    if isinstance(reply, CallTools):
        return replace(reply, calls=tuple((name, _fill(args, last)) for name, args in reply.calls))
    return reply


@dataclass
class ScriptedProvider:
    """Replies from a script; ``requests`` records every request it received."""

    script: Mapping[str, Sequence[Reply]] = field(default_factory=dict)
    name: str = "scripted"
    chunk_chars: int = 4
    requests: list[ChatRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._queues: dict[str, deque[Reply]] = {
            model: deque(replies) for model, replies in self.script.items()
        }
        self._lock = threading.Lock()

    def add(self, model: str, *replies: Reply) -> None:
        """Append replies to a model's script."""
        with self._lock:
            self._queues.setdefault(model, deque()).extend(replies)

    def counter(self, model: str) -> TokenCounter | None:
        """No tokenizer of its own: the broker uses the route's."""
        return None

    def _next(self, request: ChatRequest) -> Reply:
        with self._lock:
            self.requests.append(request)
            queue = self._queues.get(request.model) or self._queues.get("*")
            if not queue:
                raise ProviderError(f"no scripted reply left for model {request.model}", retryable=False)
            return _filled(queue.popleft(), request)

    def _usage(self, request: ChatRequest, reply: Say | CallTools) -> Usage:
        prompt = " ".join(message.content for message in request.messages)
        if isinstance(reply, Say):
            return Usage(
                reply.input_tokens if reply.input_tokens is not None else _words(prompt),
                reply.output_tokens if reply.output_tokens is not None else _words(reply.text),
            )
        return Usage(_words(prompt), sum(_words(json.dumps(dict(args))) for _, args in reply.calls))

    @staticmethod
    def _fail_before_body(reply: Fail, state: CallState) -> None:
        match reply.kind:
            case FailKind.BEFORE_SEND:
                raise ProviderError("scripted failure before the request was sent", retryable=True)
            case FailKind.STATUS_500:
                state.sent = True
                raise ProviderError("scripted upstream error", retryable=True, upstream_status=500)
            case FailKind.STATUS_429:
                state.sent = True
                raise ProviderError("scripted upstream rate limit", retryable=True, upstream_status=429)
            case FailKind.AFTER_SEND:
                state.sent = True
                raise UpstreamLostError("scripted connection drop after the request was sent")
            case FailKind.MID_STREAM:
                state.sent = True

    async def complete(self, request: ChatRequest, state: CallState) -> ChatResponse:
        """The next scripted reply, whole."""
        reply = self._next(request)
        if isinstance(reply, Fail):
            self._fail_before_body(reply, state)
            raise UpstreamLostError("scripted connection drop while reading the answer")
        state.sent = True
        usage = self._usage(request, reply)
        if isinstance(reply, CallTools):
            calls = tuple(
                ToolCall(new_id("call"), _tool_name(name, request), json.dumps(dict(args)))
                for name, args in reply.calls
            )
            return ChatResponse(
                new_id("chatcmpl"), request.model, reply.text, calls, FinishReason.TOOL_CALLS, usage
            )
        text = reply.text
        finish = FinishReason.STOP
        if request.max_tokens is not None and _words(text) > request.max_tokens:
            text = " ".join(text.split()[: request.max_tokens])
            finish = FinishReason.LENGTH
            usage = Usage(usage.input_tokens, request.max_tokens)
        return ChatResponse(
            new_id("chatcmpl"), request.model, text, (), finish, usage if reply.report_usage else None
        )

    async def stream(self, request: ChatRequest, state: CallState) -> AsyncGenerator[StreamEvent, None]:
        """The next scripted reply as events."""
        reply = self._next(request)
        if isinstance(reply, Fail):
            self._fail_before_body(reply, state)
            for start in range(0, len(reply.text), self.chunk_chars):
                yield TextDelta(reply.text[start : start + self.chunk_chars])
            raise UpstreamLostError("scripted connection drop mid-stream")
        state.sent = True
        usage = self._usage(request, reply)
        if isinstance(reply, CallTools):
            if reply.text:
                yield TextDelta(reply.text)
            for index, (name, args) in enumerate(reply.calls):
                yield ToolCallStart(index, new_id("call"), _tool_name(name, request))
                yield ToolCallDelta(index, json.dumps(dict(args)))
            yield Finished(FinishReason.TOOL_CALLS, usage)
            return
        for start in range(0, len(reply.text), self.chunk_chars):
            yield TextDelta(reply.text[start : start + self.chunk_chars])
        yield Finished(FinishReason.STOP, usage if reply.report_usage else None)

    async def aclose(self) -> None:
        """Nothing to release."""
