"""An Anthropic Messages upstream."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator

from swarmyard.broker import anthropic as messages_format
from swarmyard.broker.chat import ChatRequest, ChatResponse, Finished, StreamEvent
from swarmyard.broker.keys import Secret
from swarmyard.broker.providers.http import Timeouts, raise_for_status, sse_events
from swarmyard.broker.providers.protocol import CallState
from swarmyard.broker.providers.upstream import UpstreamClient
from swarmyard.broker.tokencount import TokenCounter
from swarmyard.errors import ProviderError, UpstreamLostError

API_VERSION = "2023-06-01"


class AnthropicProvider:
    """Speaks Messages to ``base_url`` (e.g. ``https://api.anthropic.com``) with the broker's key."""

    def __init__(
        self,
        base_url: str,
        key: Secret | None = None,
        *,
        name: str = "anthropic",
        timeouts: Timeouts | None = None,
        max_connections: int = 1000,
    ) -> None:
        self.name = name
        self._key = key
        headers = {"anthropic-version": API_VERSION}
        if key is not None:
            headers["x-api-key"] = key.reveal()
        self._client = UpstreamClient(
            base_url, headers, timeouts or Timeouts(), name=name, max_connections=max_connections
        )

    def counter(self, model: str) -> TokenCounter | None:
        """No offline tokenizer is published for Claude models: the route's bound applies."""
        return None

    async def complete(self, request: ChatRequest, state: CallState) -> ChatResponse:
        """One non-streaming call."""
        payload = json.dumps(messages_format.upstream_body(request), separators=(",", ":")).encode()
        state.sent = True
        response = await self._client.post("/v1/messages", payload)
        await raise_for_status(response, self.name, self._key)
        try:
            body = json.loads(await response.read())
        except ValueError as exc:
            raise ProviderError(f"{self.name}: upstream answer is not JSON", retryable=False) from exc
        return messages_format.parse_upstream_response(body)

    async def stream(self, request: ChatRequest, state: CallState) -> AsyncGenerator[StreamEvent, None]:
        """One streaming call, events passed on as they arrive."""
        payload = json.dumps(messages_format.upstream_body(request), separators=(",", ":")).encode()
        reader = messages_format.EventReader()
        state.sent = True
        response = await self._client.post("/v1/messages", payload)
        try:
            await raise_for_status(response, self.name, self._key)
            async for _, data in sse_events(response):
                if isinstance(data, dict):
                    for event in reader.feed(data):
                        yield event
        finally:
            await response.aclose()
        if not reader.stopped:
            raise UpstreamLostError(f"{self.name}: the stream ended without message_stop")
        yield Finished(reader.finish, reader.usage)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()
