"""OpenAI Chat Completions: requests to and from the internal shape, answers and SSE chunks both ways."""

from __future__ import annotations

import time
from typing import Any

import orjson

from swarmyard.broker.chat import (
    ChatRequest,
    ChatResponse,
    Finished,
    FinishReason,
    Message,
    Role,
    StreamEvent,
    TextDelta,
    Tool,
    ToolCall,
    ToolCallDelta,
    ToolCallStart,
    Usage,
)
from swarmyard.broker.jsonbody import (
    as_object,
    opt_bool,
    opt_list,
    opt_max_tokens,
    opt_number,
    opt_stop,
    opt_str,
    req_list,
    req_str,
)
from swarmyard.errors import InvalidInputError, UpstreamLostError

_ROLES = {
    "system": Role.SYSTEM,
    "developer": Role.SYSTEM,
    "user": Role.USER,
    "assistant": Role.ASSISTANT,
    "tool": Role.TOOL,
}


def content_text(value: Any, where: str) -> str:
    """Message content: a string, null, or a list of text parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for index, part in enumerate(value):
            part = as_object(part, f"{where}[{index}]")
            if part.get("type") not in ("text", "input_text", "output_text") or not isinstance(
                part.get("text"), str
            ):
                raise InvalidInputError(f"{where}[{index}]: only text parts are supported", field=where)
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidInputError(f"{where} must be a string or a list of text parts", field=where)


def _tool_call(raw: Any, where: str) -> ToolCall:
    call = as_object(raw, where)
    function = as_object(call.get("function"), f"{where}.function")
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        raise InvalidInputError(f"{where}.function.arguments must be a string", field=where)
    return ToolCall(
        req_str(call, "id", f"{where}."), req_str(function, "name", f"{where}.function."), arguments
    )


def parse_tools(raw: list[Any]) -> tuple[Tool, ...]:
    """``tools`` in Chat Completions form."""
    tools = []
    for index, item in enumerate(raw):
        where = f"tools[{index}]"
        item = as_object(item, where)
        function = as_object(item.get("function"), f"{where}.function")
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        tools.append(
            Tool(
                req_str(function, "name", f"{where}.function."),
                opt_str(function, "description", f"{where}.function.") or "",
                as_object(parameters, f"{where}.function.parameters"),
            )
        )
    return tuple(tools)


def parse_tool_choice(value: Any) -> str | None:
    """``tool_choice`` as ``auto``/``none``/``required`` or a function name."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict):
        function = value.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            return str(function["name"])
        if isinstance(value.get("name"), str):
            return str(value["name"])
    raise InvalidInputError("tool_choice must be a string or name a function", field="tool_choice")


def parse_request(body: dict[str, Any]) -> ChatRequest:
    """A Chat Completions request body as the internal request."""
    messages = []
    for index, raw in enumerate(req_list(body, "messages")):
        where = f"messages[{index}]"
        item = as_object(raw, where)
        role = _ROLES.get(str(item.get("role")))
        if role is None:
            raise InvalidInputError(f"{where}.role must be one of {', '.join(_ROLES)}", field=f"{where}.role")
        calls = tuple(
            _tool_call(call, f"{where}.tool_calls[{n}]")
            for n, call in enumerate(opt_list(item, "tool_calls", f"{where}."))
        )
        tool_call_id = opt_str(item, "tool_call_id", f"{where}.")
        if role is Role.TOOL and not tool_call_id:
            raise InvalidInputError(f"{where}.tool_call_id is required for tool messages", field=where)
        messages.append(
            Message(role, content_text(item.get("content"), f"{where}.content"), calls, tool_call_id)
        )
    return ChatRequest(
        model=req_str(body, "model"),
        messages=tuple(messages),
        tools=parse_tools(opt_list(body, "tools")),
        max_tokens=opt_max_tokens(body, "max_completion_tokens", "max_tokens"),
        stream=opt_bool(body, "stream"),
        temperature=opt_number(body, "temperature"),
        stop=opt_stop(body, "stop"),
        tool_choice=parse_tool_choice(body.get("tool_choice")),
    )


# -- rendering for the worker --


def _calls_json(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]


def usage_json(usage: Usage) -> dict[str, int]:
    """Usage in Chat Completions form."""
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


def render_response(response: ChatResponse, model: str, usage: Usage) -> dict[str, Any]:
    """A whole answer as a ``chat.completion`` object."""
    message: dict[str, Any] = {"role": "assistant", "content": response.text or None}
    if response.tool_calls:
        message["tool_calls"] = _calls_json(response.tool_calls)
    return {
        "id": response.id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": response.finish.value, "logprobs": None}
        ],
        "usage": usage_json(usage),
    }


class ChunkWriter:
    """Turns internal stream events into ``chat.completion.chunk`` SSE frames."""

    def __init__(self, stream_id: str, model: str) -> None:
        self._base = {
            "id": stream_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }
        self._started = False

    def _frame(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {**self._base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def open(self) -> bytes:
        """The first chunk, naming the role."""
        self._started = True
        return self._frame({"role": "assistant", "content": ""})

    def event(self, event: StreamEvent) -> bytes:
        """One event as a frame (``Finished`` is rendered by ``close``)."""
        match event:
            case TextDelta(text=text):
                return self._frame({"content": text})
            case ToolCallStart(index=index, id=call_id, name=name):
                return self._frame(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": call_id,
                                "type": "function",
                                "function": {"name": name, "arguments": ""},
                            }
                        ]
                    }
                )
            case ToolCallDelta(index=index, arguments=arguments):
                return self._frame({"tool_calls": [{"index": index, "function": {"arguments": arguments}}]})
            case Finished():
                return b""

    def close(self, finish: FinishReason, usage: Usage) -> bytes:
        """The finishing chunk, the usage chunk and ``[DONE]``."""
        usage_chunk = {**self._base, "choices": [], "usage": usage_json(usage)}
        return (
            self._frame({}, finish.value)
            + b"data: "
            + orjson.dumps(usage_chunk)
            + b"\n\ndata: [DONE]\n\n"
        )

    @staticmethod
    def error(payload: dict[str, Any]) -> bytes:
        """An error in the middle of a stream (the SDK raises it while iterating)."""
        return b"data: " + orjson.dumps(payload) + b"\n\n"


# -- the same format towards an upstream provider --


def upstream_body(request: ChatRequest) -> dict[str, Any]:
    """The internal request as a Chat Completions body for an OpenAI-compatible upstream."""
    messages: list[dict[str, Any]] = []
    for message in request.messages:
        item: dict[str, Any] = {"role": message.role.value, "content": message.content}
        if message.tool_calls:
            item["tool_calls"] = _calls_json(message.tool_calls)
            item["content"] = message.content or None
        if message.tool_call_id:
            item["tool_call_id"] = message.tool_call_id
        messages.append(item)
    body: dict[str, Any] = {"model": request.model, "messages": messages, "stream": request.stream}
    if request.max_tokens is not None:
        body["max_tokens"] = request.max_tokens
    if request.stream:
        body["stream_options"] = {"include_usage": True}
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.stop:
        body["stop"] = list(request.stop)
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
            }
            for t in request.tools
        ]
        if request.tool_choice:
            body["tool_choice"] = (
                request.tool_choice
                if request.tool_choice in ("auto", "none", "required")
                else {"type": "function", "function": {"name": request.tool_choice}}
            )
    return body


def _finish(value: Any) -> FinishReason:
    if value == "length":
        return FinishReason.LENGTH
    if value in ("tool_calls", "function_call"):
        return FinishReason.TOOL_CALLS
    return FinishReason.STOP


def _tokens(value: Any) -> int | None:
    """A token count as an upstream reports it: a non-negative integer, or nothing usable."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _usage(value: Any) -> Usage | None:
    if not isinstance(value, dict):
        return None
    prompt, completion = _tokens(value.get("prompt_tokens")), _tokens(value.get("completion_tokens"))
    if prompt is not None and completion is not None:
        return Usage(prompt, completion)
    return None  # counted by the broker instead


def _upstream_call(raw: Any) -> ToolCall:
    function = raw["function"]
    call_id, name, arguments = raw["id"], function["name"], function.get("arguments", "")
    if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
        raise TypeError("a tool call's id, name and arguments are strings")
    return ToolCall(call_id, name, arguments)


def parse_upstream_response(body: Any) -> ChatResponse:
    """An upstream ``chat.completion`` as the internal answer.

    Anything else is ``UpstreamLostError``: the request was sent and what came back is not an answer, so the
    model may have run and its cost is unknown (a ``content`` of ``123`` is not text).
    """
    try:
        choice = body["choices"][0]
        message = choice["message"]
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise TypeError("message.content is not a string")
        calls = tuple(_upstream_call(c) for c in message.get("tool_calls") or [])
        return ChatResponse(
            str(body.get("id", "")),
            str(body.get("model", "")),
            content or "",
            calls,
            _finish(choice.get("finish_reason")),
            _usage(body.get("usage")),
        )
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise UpstreamLostError(f"upstream answer is not a chat completion ({exc})") from exc


class ChunkReader:
    """Turns upstream ``chat.completion.chunk`` objects into internal events."""

    def __init__(self) -> None:
        self.finish: FinishReason = FinishReason.STOP
        self.finished = False
        self.usage: Usage | None = None
        self._seen_calls: set[int] = set()

    def feed(self, chunk: dict[str, Any]) -> list[StreamEvent]:
        """The events one chunk carries (usage is kept for the final ``Finished``)."""
        events: list[StreamEvent] = []
        usage = _usage(chunk.get("usage"))
        if usage is not None:
            self.usage = usage
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if content is not None and not isinstance(content, str):
                # not text: the stream is not an answer, and the call it belongs to is lost (its cost unknown)
                raise UpstreamLostError("upstream stream sent a delta whose content is not a string")
            if content:
                events.append(TextDelta(content))
            for call in delta.get("tool_calls") or []:
                index = int(call.get("index", 0))
                function = call.get("function") or {}
                if index not in self._seen_calls:
                    self._seen_calls.add(index)
                    events.append(
                        ToolCallStart(
                            index, str(call.get("id") or f"call_{index}"), str(function.get("name", ""))
                        )
                    )
                if function.get("arguments"):
                    events.append(ToolCallDelta(index, str(function["arguments"])))
            if choice.get("finish_reason"):
                self.finished = True
                self.finish = _finish(choice["finish_reason"])
        return events
