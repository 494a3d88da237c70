"""Anthropic Messages: requests to and from the internal shape, answers and SSE events both ways."""

from __future__ import annotations

import json
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
    req_list,
    req_str,
)
from swarmyard.errors import InvalidInputError, NestingTooDeepError, UpstreamLostError
from swarmyard.jsondepth import MAX_JSON_DEPTH, check_nesting

_STOP = {
    FinishReason.STOP: "end_turn",
    FinishReason.LENGTH: "max_tokens",
    FinishReason.TOOL_CALLS: "tool_use",
}


def _text_of(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for index, block in enumerate(value):
            block = as_object(block, f"{where}[{index}]")
            if block.get("type") != "text" or not isinstance(block.get("text"), str):
                raise InvalidInputError(f"{where}[{index}]: only text blocks are supported here", field=where)
            parts.append(block["text"])
        return "".join(parts)
    raise InvalidInputError(f"{where} must be a string or a list of text blocks", field=where)


def _messages(raw: list[Any]) -> list[Message]:
    messages: list[Message] = []
    for index, item in enumerate(raw):
        where = f"messages[{index}]"
        item = as_object(item, where)
        role = item.get("role")
        if role == "system":
            # Newer clients (Claude Code among them) put system text among the messages as well.
            messages.append(Message(Role.SYSTEM, _text_of(item.get("content"), f"{where}.content")))
            continue
        if role not in ("user", "assistant"):
            raise InvalidInputError(f"{where}.role must be user, assistant or system", field=f"{where}.role")
        content = item.get("content")
        if isinstance(content, str):
            messages.append(Message(Role(role), content))
            continue
        if not isinstance(content, list):
            raise InvalidInputError(f"{where}.content must be a string or a list of blocks", field=where)
        texts: list[str] = []
        calls: list[ToolCall] = []
        for n, block in enumerate(content):
            bwhere = f"{where}.content[{n}]"
            block = as_object(block, bwhere)
            kind = block.get("type")
            if kind == "text":
                texts.append(_text_of([block], bwhere))
            elif kind == "tool_use" and role == "assistant":
                calls.append(
                    ToolCall(
                        req_str(block, "id", f"{bwhere}."),
                        req_str(block, "name", f"{bwhere}."),
                        json.dumps(as_object(block.get("input", {}), f"{bwhere}.input")),
                    )
                )
            elif kind == "tool_result" and role == "user":
                messages.append(
                    Message(
                        Role.TOOL,
                        _text_of(block.get("content"), f"{bwhere}.content"),
                        tool_call_id=req_str(block, "tool_use_id", f"{bwhere}."),
                    )
                )
            else:
                raise InvalidInputError(f"{bwhere}: unsupported block type {kind!r}", field=bwhere)
        if texts or calls:
            messages.append(Message(Role(role), "".join(texts), tuple(calls)))
    return messages


def _tool_choice(value: Any) -> str | None:
    if value is None:
        return None
    choice = as_object(value, "tool_choice")
    kind = choice.get("type")
    if kind == "tool":
        return req_str(choice, "name", "tool_choice.")
    if kind in ("auto", "none"):
        return str(kind)
    if kind == "any":
        return "required"
    raise InvalidInputError("tool_choice.type must be auto, any, tool or none", field="tool_choice")


def parse_request(body: dict[str, Any], *, counting: bool = False) -> ChatRequest:
    """A Messages request body (or a count_tokens body when ``counting``) as the internal request."""
    system = _text_of(body.get("system"), "system")
    messages = _messages(req_list(body, "messages"))
    if system:
        messages.insert(0, Message(Role.SYSTEM, system))
    tools = []
    for index, raw in enumerate(opt_list(body, "tools")):
        tool = as_object(raw, f"tools[{index}]")
        tools.append(
            Tool(
                req_str(tool, "name", f"tools[{index}]."),
                str(tool.get("description") or ""),
                as_object(tool.get("input_schema", {"type": "object"}), f"tools[{index}].input_schema"),
            )
        )
    return ChatRequest(
        model=req_str(body, "model"),
        messages=tuple(messages),
        tools=tuple(tools),
        max_tokens=None if counting else opt_max_tokens(body, "max_tokens"),
        stream=False if counting else opt_bool(body, "stream"),
        temperature=opt_number(body, "temperature"),
        stop=opt_stop(body, "stop_sequences"),
        tool_choice=_tool_choice(body.get("tool_choice")),
    )


# -- rendering for the worker --


def tool_input(arguments: str) -> Any:
    """A tool call's JSON arguments as the object Messages carries in ``tool_use.input``.

    Text that is not JSON is kept whole under ``_raw``, and so is JSON nested deeper than a body may be (a model
    can write ``[[[[...`` for ever, and orjson writes no deeper than 255 levels: the answer to the worker would
    fail after its call was made, leaving the hold held). orjson reads an integer past 64 bits as a float.
    """
    if not arguments:
        return {}
    try:
        if arguments.count("[") + arguments.count("{") > MAX_JSON_DEPTH:
            check_nesting(arguments.encode(), field="arguments")
        return orjson.loads(arguments)
    except (ValueError, NestingTooDeepError):
        return {"_raw": arguments}


def render_response(response: ChatResponse, model: str, usage: Usage) -> dict[str, Any]:
    """A whole answer as a Messages ``message``."""
    content: list[dict[str, Any]] = []
    if response.text:
        content.append({"type": "text", "text": response.text})
    for call in response.tool_calls:
        content.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": tool_input(call.arguments)}
        )
    return {
        "id": response.id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _STOP[response.finish],
        "stop_sequence": None,
        "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens},
    }


def _frame(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: ".encode() + orjson.dumps(data) + b"\n\n"


class EventWriter:
    """Turns internal stream events into Messages SSE events."""

    def __init__(self, message_id: str, model: str, input_bound: int) -> None:
        self._id = message_id
        self._model = model
        self._input_bound = input_bound
        self._index = -1
        self._open: str | None = None

    def open(self) -> bytes:
        """``message_start``."""
        message: dict[str, Any] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self._input_bound, "output_tokens": 0},
        }
        return _frame("message_start", {"type": "message_start", "message": message})

    def _close_block(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return _frame("content_block_stop", {"type": "content_block_stop", "index": self._index})

    def _start(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close_block()
        self._index += 1
        self._open = kind
        return out + _frame(
            "content_block_start",
            {"type": "content_block_start", "index": self._index, "content_block": block},
        )

    def event(self, event: StreamEvent) -> bytes:
        """One event as SSE frames."""
        match event:
            case TextDelta(text=text):
                out = b"" if self._open == "text" else self._start("text", {"type": "text", "text": ""})
                return out + _frame(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": self._index,
                        "delta": {"type": "text_delta", "text": text},
                    },
                )
            case ToolCallStart(id=call_id, name=name):
                return self._start("tool_use", {"type": "tool_use", "id": call_id, "name": name, "input": {}})
            case ToolCallDelta(arguments=arguments):
                return _frame(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": self._index,
                        "delta": {"type": "input_json_delta", "partial_json": arguments},
                    },
                )
            case Finished():
                return b""

    def close(self, finish: FinishReason, usage: Usage) -> bytes:
        """The last block's stop, ``message_delta`` with usage and ``message_stop``."""
        return (
            self._close_block()
            + _frame(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": _STOP[finish], "stop_sequence": None},
                    "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens},
                },
            )
            + _frame("message_stop", {"type": "message_stop"})
        )

    @staticmethod
    def error(payload: dict[str, Any]) -> bytes:
        """An ``error`` event in the middle of a stream."""
        return _frame("error", payload)


def error_body(payload: dict[str, Any]) -> dict[str, Any]:
    """A swarmyard error body in the shape the Anthropic SDK reads (``type``, ``error.type``)."""
    error = dict(payload["error"])
    error.setdefault("type", error.get("code", "api_error"))
    return {"type": "error", "error": error}


# -- the same format towards an upstream provider --


def upstream_body(request: ChatRequest) -> dict[str, Any]:
    """The internal request as a Messages body for an Anthropic upstream."""
    system = "\n\n".join(m.content for m in request.messages if m.role is Role.SYSTEM)
    messages: list[dict[str, Any]] = []

    def push(role: str, blocks: list[dict[str, Any]]) -> None:
        # Anthropic wants user and assistant turns to alternate: merge neighbours of one role
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for message in request.messages:
        if message.role is Role.SYSTEM:
            continue
        if message.role is Role.TOOL:
            push(
                "user",
                [{"type": "tool_result", "tool_use_id": message.tool_call_id, "content": message.content}],
            )
            continue
        blocks: list[dict[str, Any]] = [{"type": "text", "text": message.content}] if message.content else []
        blocks += [
            {"type": "tool_use", "id": c.id, "name": c.name, "input": tool_input(c.arguments)}
            for c in message.tool_calls
        ]
        push(message.role.value, blocks)
    body: dict[str, Any] = {
        "model": request.model,
        "messages": messages,
        "max_tokens": request.max_tokens or 1024,
        "stream": request.stream,
    }
    if system:
        body["system"] = system
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.stop:
        body["stop_sequences"] = list(request.stop)
    if request.tools:
        body["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in request.tools
        ]
    return body


def _finish(value: Any) -> FinishReason:
    return {"max_tokens": FinishReason.LENGTH, "tool_use": FinishReason.TOOL_CALLS}.get(
        value, FinishReason.STOP
    )


def _tokens(value: Any) -> int | None:
    """A token count as an upstream reports it: a non-negative integer, or nothing usable."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _block_text(block: dict[str, Any]) -> str:
    text = block["text"]
    if not isinstance(text, str):
        raise TypeError("a text block's text is not a string")
    return text


def _block_call(block: dict[str, Any]) -> ToolCall:
    call_id, name = block["id"], block["name"]
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise TypeError("a tool_use block's id and name are strings")
    return ToolCall(call_id, name, json.dumps(block.get("input", {})))


def parse_upstream_response(body: Any) -> ChatResponse:
    """An upstream Messages ``message`` as the internal answer; anything else is ``UpstreamLostError`` (the
    request was sent and what came back is not an answer: its cost is unknown)."""
    try:
        texts = [_block_text(b) for b in body["content"] if b["type"] == "text"]
        calls = tuple(_block_call(b) for b in body["content"] if b["type"] == "tool_use")
        usage = body.get("usage") or {}
        counts = (_tokens(usage.get("input_tokens")), _tokens(usage.get("output_tokens")))
        return ChatResponse(
            str(body["id"]),
            str(body.get("model", "")),
            "".join(texts),
            calls,
            _finish(body.get("stop_reason")),
            Usage(counts[0], counts[1]) if counts[0] is not None and counts[1] is not None else None,
        )
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise UpstreamLostError(f"upstream answer is not an Anthropic message ({type(exc).__name__})") from exc


class EventReader:
    """Turns upstream Messages SSE events into internal events."""

    def __init__(self) -> None:
        self.finish = FinishReason.STOP
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.stopped = False
        self._tools: dict[int, int] = {}

    @property
    def usage(self) -> Usage | None:
        """Usage if the upstream reported both counts."""
        if self.input_tokens is None or self.output_tokens is None:
            return None
        return Usage(self.input_tokens, self.output_tokens)

    def feed(self, data: dict[str, Any]) -> list[StreamEvent]:
        """The events one upstream event carries."""
        kind = data.get("type")
        if kind == "message_start":
            usage = (data.get("message") or {}).get("usage") or {}
            if "input_tokens" in usage:
                self.input_tokens = _tokens(usage["input_tokens"])
        elif kind == "content_block_start":
            block = data.get("content_block") or {}
            if block.get("type") == "tool_use":
                index = len(self._tools)
                self._tools[int(data.get("index", 0))] = index
                return [ToolCallStart(index, str(block.get("id")), str(block.get("name")))]
        elif kind == "content_block_delta":
            delta = data.get("delta") or {}
            if delta.get("type") == "text_delta":
                text = delta.get("text", "")
                if not isinstance(text, str):
                    raise UpstreamLostError("upstream stream sent a text_delta whose text is not a string")
                return [TextDelta(text)]
            if delta.get("type") == "input_json_delta":
                return [
                    ToolCallDelta(
                        self._tools.get(int(data.get("index", 0)), 0), str(delta.get("partial_json"))
                    )
                ]
        elif kind == "message_delta":
            self.finish = _finish((data.get("delta") or {}).get("stop_reason"))
            usage = data.get("usage") or {}
            if "output_tokens" in usage:
                self.output_tokens = _tokens(usage["output_tokens"])
            if usage.get("input_tokens") is not None:
                self.input_tokens = _tokens(usage["input_tokens"])
        elif kind == "message_stop":
            self.stopped = True
        elif kind == "error":
            # the request was sent and the stream broke off (overloaded, say): the answer is incomplete and
            # whatever it had generated may be billed, so its cost is unknown, not nothing
            message = str((data.get("error") or {}).get("message", "upstream stream error"))[:300]
            raise UpstreamLostError(f"anthropic stream error: {message}")
        return []
