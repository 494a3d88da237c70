"""What the built-in agent may do: its tools, the output schema, and reading a model's reply as an action.

Small local models do not return native ``tool_calls``; they do follow a JSON schema. So the agent asks either
for OpenAI ``tools`` (providers that support them) or for ``response_format`` with a JSON schema whose
``action`` is an ``anyOf`` with one branch per tool, and reads either shape back into one ``Action``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from swarmyard.errors import InvalidInputError


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool the model may call: its name, what it does and its argument schema."""

    name: str
    description: str
    parameters: dict[str, Any]

    @property
    def required(self) -> tuple[str, ...]:
        """Argument names that must be present."""
        return tuple(self.parameters.get("required", ()))


def _obj(props: dict[str, Any], required: tuple[str, ...]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": False}


_STR = {"type": "string"}

#: Tools the built-in agent offers its model. ``claim_task`` and ``heartbeat`` are done by the loop itself.
TOOLS: dict[str, ToolSpec] = {
    spec.name: spec
    for spec in (
        ToolSpec("board_read", "Read recent posts on your group's board.", _obj({}, ())),
        ToolSpec(
            "board_post", "Post a short progress note to your group's board.", _obj({"body": _STR}, ("body",))
        ),
        ToolSpec("read_findings", "Read findings already submitted by your peers.", _obj({}, ())),
        ToolSpec(
            "shell",
            "Run a shell command in your own machine (it has a timeout).",
            _obj({"command": _STR}, ("command",)),
        ),
        ToolSpec("read_file", "Read a file from your working folder.", _obj({"path": _STR}, ("path",))),
        ToolSpec(
            "write_file",
            "Write a file in your working folder.",
            _obj({"path": _STR, "content": _STR}, ("path", "content")),
        ),
        ToolSpec(
            "submit_artifact",
            "Submit one attempt (text) to be stored and, where an evaluator is configured, scored.",
            _obj({"content": _STR}, ("content",)),
        ),
        ToolSpec(
            "submit_finding",
            "Submit your result and finish. Cite board posts or findings by id, and lines of your task's files as "
            "'path:line: words copied from that line'.",
            _obj({"title": _STR, "body": _STR, "cite": {"type": "array", "items": _STR}}, ("title", "body")),
        ),
    )
}

#: The tool that ends a task.
FINISH = "submit_finding"
#: ``submit_finding`` where the finding's body is the last tool result, attached by the agent (``attach_result``):
#: the model writes the title only, and cannot retype what the tool computed.
ATTACHED_FINISH = ToolSpec(
    FINISH,
    "Submit your finding and finish: its body is the result of your last tool call, attached as it is (and the "
    "call is cited). Give a short title.",
    _obj({"title": _STR}, ("title",)),
)


def citing(lines: Sequence[str]) -> ToolSpec:
    """``submit_finding`` whose ``cite`` may only hold lines a search returned, as it returned them
    (``path:line: text``): the model chooses which line its finding rests on, and a small model, left to copy a
    line itself, renames the file (the demo's 0.5B scout cited ``broker_swap.md:4`` for ``keys.md:4``)."""
    cite = {"type": "array", "items": {"type": "string", "enum": list(dict.fromkeys(lines))}, "minItems": 1,
            "maxItems": 3}
    return ToolSpec(
        FINISH,
        "Submit your result and finish: the body is one sentence of your own on what the lines mean for your "
        "task, and cite holds the line or lines it rests on, each as the search returned it.",
        _obj({"title": _STR, "body": _STR, "cite": cite}, ("title", "body", "cite")),
    )


def with_attached(tools: dict[str, ToolSpec]) -> dict[str, ToolSpec]:
    """``tools`` with ``submit_finding`` taking no body (it is attached): see :data:`ATTACHED_FINISH`."""
    return {name: ATTACHED_FINISH if name == FINISH else spec for name, spec in tools.items()}


@dataclass(frozen=True, slots=True)
class Action:
    """One step the model chose: a tool and its arguments."""

    tool: str
    args: dict[str, Any]


def openai_tools(tools: dict[str, ToolSpec] = TOOLS) -> list[dict[str, Any]]:
    """The tools in OpenAI ``tools`` form."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools.values()
    ]


def action_schema(tools: dict[str, ToolSpec] = TOOLS) -> dict[str, Any]:
    """A JSON schema for one action: an object whose ``action`` is one branch per tool (``anyOf``)."""
    branches = [
        _obj({"tool": {"type": "string", "const": t.name}, "args": t.parameters}, ("tool", "args"))
        for t in tools.values()
    ]
    # the root is an object, not a bare anyOf: OpenAI's strict structured outputs require that
    return _obj({"action": {"anyOf": branches}}, ("action",))


def response_format(tools: dict[str, ToolSpec] = TOOLS) -> dict[str, Any]:
    """The OpenAI ``response_format`` asking for one action."""
    return {
        "type": "json_schema",
        "json_schema": {"name": "action", "strict": True, "schema": action_schema(tools)},
    }


def _first_json_object(text: str) -> Any:
    stripped = text.strip()
    if stripped.startswith("```"):
        stripped = stripped.strip("`").removeprefix("json").strip()
    start = stripped.find("{")
    if start < 0:
        raise InvalidInputError("the reply holds no JSON object", field="reply")
    try:
        value, _ = json.JSONDecoder().raw_decode(stripped[start:])
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"the reply is not valid JSON: {exc.msg}", field="reply") from exc
    except RecursionError:  # nested past the parser's stack
        raise InvalidInputError("the reply is nested too deeply", field="reply") from None
    return value


def says_something(body: str) -> bool:
    """Whether a finding's body holds a word outside its bracketed citations.

    A small lead sometimes answers with its citations alone (``[fnd_...]``): that is no synthesis.
    """
    return re.search(r"[^\W\d_]", re.sub(r"\[[^\]]*\]", "", body)) is not None


def check_action(tool: object, args: object, tools: dict[str, ToolSpec] = TOOLS, *,
                 choices: Collection[str] | None = None) -> Action:
    """Validate a tool name and its arguments against the table; an unknown name is answered with ``choices``
    (the tools the model is offered; by default the whole table)."""
    if not isinstance(tool, str) or tool not in tools:
        offered = ", ".join(tools if choices is None else choices)
        raise InvalidInputError(f"unknown tool {tool!r}; choose one of {offered}", field="tool")
    if not isinstance(args, dict):
        raise InvalidInputError("args must be a JSON object", field="args")
    spec = tools[tool]
    missing = [name for name in spec.required if not isinstance(args.get(name), str) or not args.get(name)]
    if missing:
        raise InvalidInputError(f"{tool} needs {', '.join(missing)}", field="args")
    if tool == FINISH and "body" in spec.required and not says_something(str(args["body"])):
        raise InvalidInputError("the body must say in words what was found, not only cite findings", field="body")
    known = spec.parameters.get("properties", {})
    return Action(tool, {k: v for k, v in args.items() if k in known})


def parse_reply(text: str, tools: dict[str, ToolSpec] = TOOLS, *, choices: Collection[str] | None = None) -> Action:
    """Read an action from a reply's text: ``{"action": {"tool", "args"}}`` or a bare ``{"tool", "args"}``."""
    value = _first_json_object(text)
    if not isinstance(value, dict):
        raise InvalidInputError("the reply must be a JSON object", field="reply")
    inner = value.get("action", value)
    if not isinstance(inner, dict):
        raise InvalidInputError("action must be a JSON object", field="action")
    if "tool" not in inner and "name" in inner:  # a common slip: OpenAI's function shape
        inner = {"tool": inner["name"], "args": inner.get("arguments", inner.get("args", {}))}
    args = inner.get("args", inner.get("arguments", {}))  # "arguments": the local model's own tool shape
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise InvalidInputError("args is not a JSON object", field="args") from exc
    return check_action(inner.get("tool"), args, tools, choices=choices)


def parse_tool_call(name: str, arguments: str, tools: dict[str, ToolSpec] = TOOLS, *,
                    choices: Collection[str] | None = None) -> Action:
    """Read an action from a native ``tool_calls`` entry."""
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"arguments of {name} are not JSON: {exc.msg}", field="args") from exc
    except RecursionError:  # nested past the parser's stack
        raise InvalidInputError(f"arguments of {name} are nested too deeply", field="args") from None
    return check_action(name, args, tools, choices=choices)


def _string_field(text: str, name: str) -> str | None:
    """The value of ``"name": "..."`` in possibly cut-off JSON: up to its closing quote, or to the end."""
    found = re.search(rf'"{name}"\s*:\s*"', text)
    if found is None:
        return None
    raw = re.match(r'(?:[^"\\]|\\.)*', text[found.end():])
    value = raw.group(0) if raw else ""
    try:
        return str(json.loads(f'"{value}"'))
    except json.JSONDecodeError:
        return value


def salvage_submission(text: str) -> dict[str, str] | None:
    """The title and body of a ``submit_finding`` cut off mid-JSON (a model that ran out of tokens), if any.

    A small model often writes a long body and is stopped at ``max_tokens`` before the JSON closes; what it
    wrote is still its finding, and better than the raw JSON or nothing.
    """
    if FINISH not in text and '"body"' not in text:
        return None
    body = _string_field(text, "body")
    if not body or not says_something(body):
        return None
    return {"title": _string_field(text, "title") or "finding", "body": body.strip()}
