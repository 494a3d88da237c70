"""The agent's model: OpenAI chat completions through the broker, with the worker's token as the API key."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from swarmyard.agents.actions import TOOLS, ToolSpec, openai_tools, response_format
from swarmyard.errors import BudgetError, ContextLengthError, ProviderError, SwarmyardError
from swarmyard.plane.lean_client import connect_errors, http_errors

if TYPE_CHECKING:
    from swarmyard.plane.lean_client import HttpClient, HttpResponse


class OutputMode(StrEnum):
    """How the agent asks for structured output."""

    TOOLS = "tools"  # OpenAI function tools; the broker turns them into a schema for local models
    JSON_SCHEMA = "json_schema"  # response_format json_schema with one anyOf branch per tool
    TEXT = "text"  # instructions only, for providers with neither


@dataclass(frozen=True, slots=True)
class ModelReply:
    """What the model said: text and any native tool calls (name, JSON arguments)."""

    text: str
    tool_calls: tuple[tuple[str, str], ...] = ()
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(slots=True)
class Usage:
    """Running totals for one agent."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    extra: dict[str, int] = field(default_factory=dict)


class ChatModel(Protocol):
    """Anything that answers a conversation with one reply."""

    async def reply(self, messages: list[dict[str, Any]], *, only: frozenset[str] | None = None,
                    specs: Mapping[str, ToolSpec] | None = None) -> ModelReply:
        """One completion for ``messages``; ``only`` narrows the tools offered for this one call (an empty set:
        none, and the answer is plain text), and ``specs`` narrows a tool's arguments for it (a finding that
        may cite only the lines a search returned)."""
        ...


class BrokerChatModel:
    """``POST {base}/v1/chat/completions`` on the broker; errors come back typed."""

    def __init__(
        self,
        client: HttpClient,
        model: str,
        *,
        mode: OutputMode = OutputMode.TOOLS,
        max_tokens: int = 512,
        tools: dict[str, ToolSpec] = TOOLS,
    ) -> None:
        self._client = client
        self._model = model
        self._mode = mode
        self._max_tokens = max_tokens
        self._tools = tools
        self.usage = Usage()

    def _body(self, messages: list[dict[str, Any]], only: frozenset[str] | None = None,
              specs: Mapping[str, ToolSpec] | None = None) -> dict[str, Any]:
        offered = {**self._tools, **{k: v for k, v in (specs or {}).items() if k in self._tools}}
        tools = offered if only is None else {k: v for k, v in offered.items() if k in only}
        body: dict[str, Any] = {
            "model": self._model,
            "messages": messages,
            "max_tokens": self._max_tokens,
            "temperature": 0.2,
        }
        if not tools:
            return body  # ``only`` named no tool: a plain-text answer
        if self._mode is OutputMode.TOOLS:
            body["tools"] = openai_tools(tools)
            body["tool_choice"] = "required"
        elif self._mode is OutputMode.JSON_SCHEMA:
            body["response_format"] = response_format(tools)
        return body

    async def reply(self, messages: list[dict[str, Any]], *, only: frozenset[str] | None = None,
                    specs: Mapping[str, ToolSpec] | None = None) -> ModelReply:
        """Ask once. A budget refusal is a ``BudgetError`` (it ends the agent), a conversation too long for the
        model a ``ContextLengthError``; every other failure is a ``ProviderError`` whose ``retryable`` says
        whether asking again is safe (never once the request may have reached the model)."""
        try:
            response = await self._client.post("/v1/chat/completions", json=self._body(messages, only, specs))
        except connect_errors() as exc:
            # nothing reached the broker: nothing can have been held or spent
            raise ProviderError(f"broker unreachable: {exc}", retryable=True) from exc
        except http_errors() as exc:
            # the request may have been admitted and sent upstream: asking again could pay twice
            raise ProviderError(f"the broker's answer was lost ({type(exc).__name__}): {exc}") from exc
        if response.status_code >= 400:
            raise _refusal(response)
        try:
            data = response.json()
            message = data["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError, RecursionError) as exc:
            raise ProviderError("the broker's answer is not a chat completion") from exc
        calls = tuple(
            (str(c["function"]["name"]), str(c["function"].get("arguments") or "{}"))
            for c in message.get("tool_calls") or ()
            if isinstance(c, dict) and "function" in c
        )
        usage = data.get("usage") or {}
        reply = ModelReply(
            str(message.get("content") or ""),
            calls,
            int(usage.get("prompt_tokens", 0)),
            int(usage.get("completion_tokens", 0)),
        )
        self.usage.calls += 1
        self.usage.input_tokens += reply.input_tokens
        self.usage.output_tokens += reply.output_tokens
        return reply


def _refusal(response: HttpResponse) -> SwarmyardError:
    """The broker's error answer as the error the agent acts on.

    The broker's typed error is rebuilt by its code; budget and context refusals are raised as they are, and
    anything else is a ``ProviderError`` retryable only if the body says so and ``x-should-retry`` says
    ``true``, which the broker sends with every error of its own. An ``upstream_unknown`` says no in both (its
    cost is unknown and a second call would be a second hold); an answer without the header (the plane's
    ``internal_error``, a proxy's) did not come from the broker's judgement, and may have followed a hold.
    """
    try:
        body = response.json()
    except (ValueError, RecursionError):
        body = None
    status = response.status_code
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        # not the broker's answer (a relay or proxy in between): whether the call was made is unknown
        return ProviderError(f"broker answered {status}: {response.text[:300]}", upstream_status=status)
    error = SwarmyardError.from_dict(body, status=status)
    if isinstance(error, BudgetError | ContextLengthError):
        return error
    retryable = error.retryable and response.headers.get("x-should-retry", "").lower() == "true"
    if isinstance(error, ProviderError):
        error.retryable = retryable
        return error
    failure = ProviderError(f"broker answered {status} ({error.code}): {error.message[:300]}",
                            retryable=retryable, upstream_status=status)
    failure.__cause__ = error
    return failure
