"""OpenAI Responses (what Codex speaks): requests to the internal shape, answers and SSE events back."""

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
from swarmyard.broker.formats.openai_chat import content_text, parse_tool_choice
from swarmyard.broker.jsonbody import (
    as_object,
    opt_bool,
    opt_list,
    opt_max_tokens,
    opt_number,
    opt_str,
    req_str,
)
from swarmyard.errors import InvalidInputError
from swarmyard.ids import new_id

_ROLES = {"system": Role.SYSTEM, "developer": Role.SYSTEM, "user": Role.USER, "assistant": Role.ASSISTANT}
#: Input items that carry nothing a provider of another family could use (Codex replays its reasoning).
_SKIPPED_ITEMS = frozenset({"reasoning"})


def _input(value: Any) -> list[Message]:
    if isinstance(value, str):
        return [Message(Role.USER, value)]
    if not isinstance(value, list) or not value:
        raise InvalidInputError("input must be a string or a non-empty list of items", field="input")
    messages: list[Message] = []
    for index, raw in enumerate(value):
        where = f"input[{index}]"
        item = as_object(raw, where)
        kind = item.get("type", "message")
        if kind == "message":
            role = _ROLES.get(str(item.get("role")))
            if role is None:
                raise InvalidInputError(
                    f"{where}.role must be one of {', '.join(_ROLES)}", field=f"{where}.role"
                )
            messages.append(Message(role, content_text(item.get("content"), f"{where}.content")))
        elif kind == "function_call":
            call = ToolCall(
                req_str(item, "call_id", f"{where}."),
                _call_name(item, where),
                opt_str(item, "arguments", f"{where}.") or "{}",
            )
            if messages and messages[-1].role is Role.ASSISTANT and not messages[-1].tool_call_id:
                last = messages.pop()
                messages.append(Message(Role.ASSISTANT, last.content, (*last.tool_calls, call)))
            else:
                messages.append(Message(Role.ASSISTANT, "", (call,)))
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else content_text(output, f"{where}.output")
            messages.append(Message(Role.TOOL, text, tool_call_id=req_str(item, "call_id", f"{where}.")))
        elif kind in _SKIPPED_ITEMS:
            continue
        else:
            raise InvalidInputError(f"{where}: unsupported input item type {kind!r}", field=where)
    return messages


#: How a tool of a ``namespace`` group is named to the model: ``<namespace>__<tool>`` (Codex groups an MCP
#: server's tools as namespace ``mcp__<server>``, which gives the names it used before it grouped them).
NAMESPACE_JOIN = "__"


def _call_name(item: dict[str, Any], where: str) -> str:
    """A function call's tool name, with its namespace joined in front when it has one."""
    name = req_str(item, "name", f"{where}.")
    namespace = opt_str(item, "namespace", f"{where}.")
    return f"{namespace}{NAMESPACE_JOIN}{name}" if namespace else name


def _tools(raw: list[Any], prefix: str = "", at: str = "tools") -> tuple[Tool, ...]:
    tools: list[Tool] = []
    for index, item in enumerate(raw):
        where = f"{at}[{index}]"
        tool = as_object(item, where)
        if not isinstance(tool.get("type"), str):
            raise InvalidInputError(f"{where}.type must be a string", field=f"{where}.type")
        if tool["type"] == "namespace" and not prefix:
            # a group of function tools (one level deep): each offered under its joined name
            namespace = req_str(tool, "name", f"{where}.") + NAMESPACE_JOIN
            tools += _tools(opt_list(tool, "tools", f"{where}."), namespace, f"{where}.tools")
            continue
        if tool["type"] != "function":
            # Hosted tools (web search, a provider-side shell, ...) run at the provider and would reach past
            # the sandbox; agents such as Codex offer them by default. The model simply does not get them.
            continue
        tools.append(
            Tool(
                prefix + req_str(tool, "name", f"{where}."),
                opt_str(tool, "description", f"{where}.") or "",
                as_object(
                    tool.get("parameters") or {"type": "object", "properties": {}}, f"{where}.parameters"
                ),
            )
        )
    return tuple(tools)


def parse_request(body: dict[str, Any]) -> ChatRequest:
    """A Responses request body as the internal request."""
    if body.get("previous_response_id"):
        # the broker keeps no conversation state; the client must send the whole input
        raise InvalidInputError(
            "previous_response_id is not supported: send the full input", field="previous_response_id"
        )
    messages = _input(body.get("input"))
    instructions = opt_str(body, "instructions")
    if instructions:
        messages.insert(0, Message(Role.SYSTEM, instructions))
    return ChatRequest(
        model=req_str(body, "model"),
        messages=tuple(messages),
        tools=_tools(opt_list(body, "tools")),
        max_tokens=opt_max_tokens(body, "max_output_tokens"),
        stream=opt_bool(body, "stream"),
        temperature=opt_number(body, "temperature"),
        tool_choice=parse_tool_choice(body.get("tool_choice")),
    )


def usage_json(usage: Usage) -> dict[str, Any]:
    """Usage in Responses form."""
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = (
        [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        if status == "completed"
        else []
    )
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _named(name: str) -> dict[str, str]:
    """A call's ``name``, and its ``namespace`` when the name is one of an MCP server's joined tool names.

    Codex refuses a call of ``mcp__<server>__<tool>`` that names no namespace ("unsupported call"); the
    renderer does not see the request, so it goes by the ``mcp__`` form Codex gives every MCP namespace."""
    if name.startswith("mcp" + NAMESPACE_JOIN):
        namespace, join, tool = name.rpartition(NAMESPACE_JOIN)
        if join and tool and namespace != "mcp":
            return {"namespace": namespace, "name": tool}
    return {"name": name}


def _call_item(item_id: str, call: ToolCall, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        **_named(call.name),
        "arguments": call.arguments,
        "status": status,
    }


def _envelope(
    response_id: str,
    model: str,
    status: str,
    output: list[dict[str, Any]],
    usage: Usage | None,
    finish: FinishReason | None,
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": output,
        "usage": usage_json(usage) if usage else None,
        "incomplete_details": {"reason": "max_output_tokens"} if finish is FinishReason.LENGTH else None,
        "error": None,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "temperature": None,
        "top_p": None,
    }


def render_response(response: ChatResponse, model: str, usage: Usage) -> dict[str, Any]:
    """A whole answer as a ``response`` object."""
    output: list[dict[str, Any]] = []
    if response.text:
        output.append(_message_item(new_id("msg"), response.text, "completed"))
    output += [_call_item(new_id("fc"), call, "completed") for call in response.tool_calls]
    status = "incomplete" if response.finish is FinishReason.LENGTH else "completed"
    return _envelope(new_id("resp"), model, status, output, usage, response.finish)


class EventWriter:
    """Turns internal stream events into Responses SSE events, each with its ``sequence_number``."""

    def __init__(self, model: str) -> None:
        self._id = new_id("resp")
        self._model = model
        self._seq = 0
        self._items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._text: list[str] = []
        self._calls: dict[int, int] = {}

    def _frame(self, name: str, data: dict[str, Any]) -> bytes:
        data = {"type": name, "sequence_number": self._seq, **data}
        self._seq += 1
        return f"event: {name}\ndata: ".encode() + orjson.dumps(data) + b"\n\n"

    def open(self) -> bytes:
        """``response.created`` and ``response.in_progress``."""
        envelope = _envelope(self._id, self._model, "in_progress", [], None, None)
        return self._frame("response.created", {"response": envelope}) + self._frame(
            "response.in_progress", {"response": envelope}
        )

    def _close_item(self) -> bytes:
        item, self._open = self._open, None
        if item is None:
            return b""
        index = len(self._items)
        if item["type"] == "message":
            text = "".join(self._text)
            self._text = []
            done = _message_item(item["id"], text, "completed")
            part = done["content"][0]
            out = self._frame(
                "response.output_text.done",
                {
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "text": text,
                    "logprobs": [],
                },
            ) + self._frame(
                "response.content_part.done",
                {"item_id": item["id"], "output_index": index, "content_index": 0, "part": part},
            )
        else:
            done = {**item, "status": "completed"}
            out = self._frame(
                "response.function_call_arguments.done",
                {
                    "item_id": item["id"],
                    "output_index": index,
                    "arguments": item["arguments"],
                    "name": item["name"],
                },
            )
        self._items.append(done)
        return out + self._frame("response.output_item.done", {"output_index": index, "item": done})

    def event(self, event: StreamEvent) -> bytes:
        """One event as SSE frames."""
        index = len(self._items)
        match event:
            case TextDelta(text=text):
                out = b""
                if self._open is None or self._open["type"] != "message":
                    out = self._close_item()
                    index = len(self._items)
                    self._open = _message_item(new_id("msg"), "", "in_progress")
                    out += self._frame(
                        "response.output_item.added", {"output_index": index, "item": self._open}
                    )
                    out += self._frame(
                        "response.content_part.added",
                        {
                            "item_id": self._open["id"],
                            "output_index": index,
                            "content_index": 0,
                            "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []},
                        },
                    )
                self._text.append(text)
                return out + self._frame(
                    "response.output_text.delta",
                    {
                        "item_id": self._open["id"],
                        "output_index": index,
                        "content_index": 0,
                        "delta": text,
                        "logprobs": [],
                    },
                )
            case ToolCallStart(index=call_index, id=call_id, name=name):
                out = self._close_item()
                index = len(self._items)
                self._open = _call_item(new_id("fc"), ToolCall(call_id, name, ""), "in_progress")
                self._calls[call_index] = index
                return out + self._frame(
                    "response.output_item.added", {"output_index": index, "item": self._open}
                )
            case ToolCallDelta(arguments=arguments):
                if self._open is None or self._open["type"] != "function_call":
                    return b""
                self._open["arguments"] += arguments
                return self._frame(
                    "response.function_call_arguments.delta",
                    {"item_id": self._open["id"], "output_index": index, "delta": arguments},
                )
            case Finished():
                return b""

    def close(self, finish: FinishReason, usage: Usage) -> bytes:
        """The open item's done events and ``response.completed``."""
        out = self._close_item()
        status = "incomplete" if finish is FinishReason.LENGTH else "completed"
        envelope = _envelope(self._id, self._model, status, self._items, usage, finish)
        name = "response.incomplete" if status == "incomplete" else "response.completed"
        return out + self._frame(name, {"response": envelope})

    def error(self, payload: dict[str, Any]) -> bytes:
        """An ``error`` event in the middle of a stream."""
        error = payload["error"]
        return self._frame(
            "error",
            {"code": error.get("code"), "message": error.get("message"), "param": None, "error": error},
        )
