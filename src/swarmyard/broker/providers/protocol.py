"""The provider Protocol: one internal request in, one answer or a stream of events out.

A provider sets ``CallState.sent`` just before its request bytes leave. It raises ``ProviderError`` when the
upstream answered with an error or nothing was sent (the broker releases the hold), and ``UpstreamLostError``
when, after sending, no whole and well-formed answer came back: the connection dropped or timed out, the body
was cut or does not parse, a stream ended before its end (the broker marks the hold unknown).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from swarmyard.broker.chat import ChatRequest, ChatResponse, StreamEvent
from swarmyard.broker.tokencount import TokenCounter

#: An agent CLI's name by the product its requests' ``User-Agent`` starts with (Claude Code sends
#: ``claude-cli/2.1.197 (external, cli)``, Codex ``codex_cli_rs/0.171.0 ...``, opencode ``opencode/1.18.33``).
AGENT_CLIS = {"claude-cli": "claude", "claude-code": "claude", "codex_cli_rs": "codex", "codex_exec": "codex",
              "opencode": "opencode"}
#: The agent CLI making the call under way ("" for any other caller), set by the broker for each request.
CALLING_AGENT: ContextVar[str] = ContextVar("swarmyard_calling_agent", default="")


def agent_cli(user_agent: str) -> str:
    """The agent CLI a ``User-Agent`` names (see :data:`AGENT_CLIS`), or "" for any other client (the built-in
    agent, an SDK, a CLI this table does not know). Only how the model is asked depends on it (a CLI's long tool
    listing shortened, its rounds of tools bounded), never what a caller may spend or see."""
    product = user_agent.strip().split("/", 1)[0].split(" ", 1)[0].lower()
    return AGENT_CLIS.get(product, "")


@dataclass(slots=True)
class CallState:
    """Mutable facts about one upstream call that the broker needs after it fails; ``caller`` is the worker
    making it (a provider that answers each worker in turn tells them apart by it); ``agent`` the agent CLI that
    sends it, if one does (:func:`agent_cli`, from the request the broker is serving)."""

    sent: bool = False
    caller: str = ""
    agent: str = field(default_factory=CALLING_AGENT.get)


class Provider(Protocol):
    """A source of model answers."""

    name: str

    def counter(self, model: str) -> TokenCounter | None:
        """The provider's own verified tokenizer for ``model``, if it has one."""
        ...

    async def complete(self, request: ChatRequest, state: CallState) -> ChatResponse:
        """Answer a request whole."""
        ...

    def stream(self, request: ChatRequest, state: CallState) -> AsyncGenerator[StreamEvent, None]:
        """Answer a request as events, ending with ``Finished``."""
        ...

    async def aclose(self) -> None:
        """Release connections and models."""
        ...


@runtime_checkable
class TakesTurns(Protocol):
    """A provider that answers its callers in turn (``swarmyard.broker.providers.turns``) and must hear of a
    caller whose call the broker refused before it reached the provider: that caller calls no more."""

    def refused(self, caller: str) -> None:
        """``caller``'s call was refused (a cap or the budget ran out)."""
        ...
