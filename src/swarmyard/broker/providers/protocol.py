"""The provider Protocol: one internal request in, one answer or a stream of events out.

A provider sets ``CallState.sent`` just before its request bytes leave. It raises ``ProviderError`` when the
upstream answered with an error or nothing was sent (the broker releases the hold), and ``UpstreamLostError``
when, after sending, no whole and well-formed answer came back: the connection dropped or timed out, the body
was cut or does not parse, a stream ended before its end (the broker marks the hold unknown).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from swarmyard.broker.chat import ChatRequest, ChatResponse, StreamEvent
from swarmyard.broker.tokencount import TokenCounter


@dataclass(slots=True)
class CallState:
    """Mutable facts about one upstream call that the broker needs after it fails; ``caller`` is the worker
    making it (a provider that answers each worker in turn tells them apart by it)."""

    sent: bool = False
    caller: str = ""


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
