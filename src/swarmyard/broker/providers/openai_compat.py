"""An OpenAI-compatible upstream: OpenAI, DeepSeek, vLLM, the llama.cpp server, Ollama."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from swarmyard.broker.chat import ChatRequest, ChatResponse, Finished, StreamEvent
from swarmyard.broker.formats import openai_chat
from swarmyard.broker.keys import Secret
from swarmyard.broker.providers.http import post_json, stream_json_events
from swarmyard.broker.providers.protocol import CallState
from swarmyard.broker.providers.redact import scrubbed_stream
from swarmyard.broker.providers.upstream import Timeouts, UpstreamClient
from swarmyard.broker.tokencount import TokenCounter
from swarmyard.errors import UpstreamLostError


class OpenAICompatProvider:
    """Speaks Chat Completions to ``base_url`` (which ends in ``/v1``) with the broker's key."""

    def __init__(
        self,
        base_url: str,
        key: Secret | None = None,
        *,
        name: str = "openai",
        timeouts: Timeouts | None = None,
        extra_body: dict[str, Any] | None = None,
        max_connections: int = 1000,
    ) -> None:
        self.name = name
        self._key = key
        self._extra = extra_body or {}
        headers = {"authorization": f"Bearer {key.reveal()}"} if key is not None else {}
        self._client = UpstreamClient(
            base_url, headers, timeouts or Timeouts(), name=name, max_connections=max_connections
        )

    def counter(self, model: str) -> TokenCounter | None:
        """No tokenizer of its own; the route chooses."""
        return None

    def _body(self, request: ChatRequest) -> dict[str, Any]:
        return {**openai_chat.upstream_body(request), **self._extra}

    async def complete(self, request: ChatRequest, state: CallState) -> ChatResponse:
        """One non-streaming call."""
        return await self.complete_body(self._body(request), state)

    async def complete_body(self, body: dict[str, Any], state: CallState) -> ChatResponse:
        """One non-streaming call with a ready Chat Completions body (for providers that add fields)."""
        answer = await post_json(self._client, "/chat/completions", body, state, provider=self.name)
        return openai_chat.parse_upstream_response(answer)

    async def stream(self, request: ChatRequest, state: CallState) -> AsyncGenerator[StreamEvent, None]:
        """One streaming call, events passed on as each chunk arrives."""
        reader = openai_chat.ChunkReader()

        def end() -> Finished:
            if not reader.finished:
                # a clean close without a finish reason still lost the end of the answer
                raise UpstreamLostError(f"{self.name}: the stream ended without a finish reason")
            return Finished(reader.finish, reader.usage)

        events = stream_json_events(self._client, "/chat/completions", self._body(request), state, reader.feed,
                                    provider=self.name, until_done=True)
        async for event in scrubbed_stream(events, end):
            yield event

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()
