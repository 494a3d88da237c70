"""An Anthropic Messages upstream."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from swarmyard.broker.chat import ChatRequest, ChatResponse, Finished, StreamEvent
from swarmyard.broker.formats import anthropic as messages_format
from swarmyard.broker.keys import Secret
from swarmyard.broker.providers.http import post_json, stream_json_events
from swarmyard.broker.providers.protocol import CallState
from swarmyard.broker.providers.redact import scrubbed_stream
from swarmyard.broker.providers.upstream import Timeouts, UpstreamClient
from swarmyard.broker.tokencount import TokenCounter
from swarmyard.errors import UpstreamLostError

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
        body = await post_json(self._client, "/v1/messages", messages_format.upstream_body(request), state,
                               provider=self.name)
        return messages_format.parse_upstream_response(body)

    async def stream(self, request: ChatRequest, state: CallState) -> AsyncGenerator[StreamEvent, None]:
        """One streaming call, events passed on as they arrive."""
        reader = messages_format.EventReader()

        def end() -> Finished:
            if not reader.stopped:
                raise UpstreamLostError(f"{self.name}: the stream ended without message_stop")
            return Finished(reader.finish, reader.usage)

        events = stream_json_events(self._client, "/v1/messages", messages_format.upstream_body(request), state,
                                    reader.feed, provider=self.name)
        async for event in scrubbed_stream(events, end):
            yield event

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()
