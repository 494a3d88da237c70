"""The one internal request/response shape that every API format translates to and every provider speaks."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Role(StrEnum):
    """Who said a message."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class FinishReason(StrEnum):
    """Why generation stopped."""

    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the model asks for; ``arguments`` is a JSON object as text."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Message:
    """One conversation turn; tool results carry ``tool_call_id``."""

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call, with its JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A generation request after parsing; ``max_tokens`` is None until the ledger fills it in."""

    model: str
    messages: tuple[Message, ...]
    tools: tuple[Tool, ...] = ()
    max_tokens: int | None = None
    stream: bool = False
    temperature: float | None = None
    stop: tuple[str, ...] = ()
    tool_choice: str | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens a call used, as the provider reported them (or as the broker counted them)."""

    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class ChatResponse:
    """A whole answer."""

    id: str
    model: str
    text: str
    tool_calls: tuple[ToolCall, ...]
    finish: FinishReason
    usage: Usage | None


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of streamed text."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A streamed tool call begins (its arguments follow as ``ToolCallDelta``)."""

    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a streamed tool call's JSON arguments."""

    index: int
    arguments: str


@dataclass(frozen=True, slots=True)
class Finished:
    """The stream is over; ``usage`` is None when the provider reported none."""

    finish: FinishReason
    usage: Usage | None = None


StreamEvent = TextDelta | ToolCallStart | ToolCallDelta | Finished


@dataclass(slots=True)
class StreamTally:
    """What a stream carried so far, so a stream without usage can still be settled by counting."""

    text: list[str] = field(default_factory=list)
    tool_calls: dict[int, list[str]] = field(default_factory=dict)
    tool_meta: dict[int, tuple[str, str]] = field(default_factory=dict)

    def add(self, event: StreamEvent) -> None:
        """Record one event."""
        match event:
            case TextDelta(text=text):
                self.text.append(text)
            case ToolCallStart(index=index, id=call_id, name=name):
                self.tool_meta[index] = (call_id, name)
                self.tool_calls.setdefault(index, [])
            case ToolCallDelta(index=index, arguments=arguments):
                self.tool_calls.setdefault(index, []).append(arguments)
            case Finished():
                pass

    def output_text(self) -> str:
        """All streamed output (text and tool-call names and arguments) as one string for counting."""
        parts = ["".join(self.text)]
        for index, pieces in sorted(self.tool_calls.items()):
            parts.append(self.tool_meta.get(index, ("", ""))[1])
            parts.append("".join(pieces))
        return "\n".join(parts)
