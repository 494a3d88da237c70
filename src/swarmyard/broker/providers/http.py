"""What the HTTP upstream providers share: status checks, SSE reading, scrubbing."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any

import orjson

from swarmyard.broker.keys import Secret
from swarmyard.broker.keys import scrub as scrub_held
from swarmyard.broker.providers.upstream import UpstreamClient, UpstreamResponse
from swarmyard.errors import ContextLengthError, ProviderError, UpstreamLostError

if TYPE_CHECKING:
    from swarmyard.broker.chat import StreamEvent
    from swarmyard.broker.providers.protocol import CallState

_RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
_DRAIN_S = 1.0


def scrub(text: str, key: Secret | None) -> str:
    """``text`` with the provider key (if it appears) replaced, and every key the broker holds in any
    encoding (``swarmyard.broker.keys.scrub``), before it is cut to a readable length."""
    if key is not None and key.reveal():
        text = text.replace(key.reveal(), "***")
    return scrub_held(text)[:300]


#: How OpenAI (and compatibles), llama.cpp and Anthropic say a prompt does not fit the context window.
_CONTEXT_MARKERS = ("context_length_exceeded", "exceed_context_size_error", "prompt is too long")


def _int_field(raw: str, name: str) -> int | None:
    found = re.search(rf'"{name}"\s*:\s*(\d+)', raw)
    return int(found.group(1)) if found else None


async def raise_for_status(response: UpstreamResponse, provider: str, key: Secret | None) -> None:
    """Turn an upstream error status into ``ProviderError`` (the answer came back: nothing to bill)."""
    if response.status < 400:
        return
    try:
        raw = (await response.read()).decode("utf-8", "replace")
    except UpstreamLostError:
        raw = ""
    if response.status == 400 and any(marker in raw for marker in _CONTEXT_MARKERS):
        # the worker's conversation is too long for the model: its own error to fix, not the provider's
        raise ContextLengthError(provider, _int_field(raw, "n_prompt_tokens"), _int_field(raw, "n_ctx"))
    raise ProviderError(
        f"{provider}: upstream answered {response.status}: {scrub(raw, key)}",
        retryable=response.status in _RETRYABLE_STATUS,
        upstream_status=response.status,
    )


async def _drain(lines: AsyncIterator[str]) -> None:
    """Read the little a body still holds after its last event, so its connection goes back to the pool.

    A server that keeps the body open past ``[DONE]`` gets ``_DRAIN_S``; then the connection is closed
    instead (everything the answer carried was already read).
    """
    try:
        async with asyncio.timeout(_DRAIN_S):
            async for _ in lines:
                pass
    except (TimeoutError, UpstreamLostError):
        pass


async def sse_events(response: UpstreamResponse, *, until_done: bool = False) -> AsyncIterator[tuple[str | None, Any]]:
    """``(event name, parsed data)`` for each SSE event; stops at ``[DONE]``.

    With ``until_done`` a body that ends before ``[DONE]`` is a lost answer: a stream cut after its last event
    looks the same as a finished one until its terminator is missing.
    """
    event: str | None = None
    lines = response.lines()
    async for line in lines:
        if not line:
            event = None
            continue
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
            if data == "[DONE]":
                await _drain(lines)
                return
            try:
                parsed = orjson.loads(data)
            except ValueError as exc:
                raise UpstreamLostError("upstream sent a malformed stream event") from exc
            yield event, parsed
    if until_done:
        raise UpstreamLostError("the upstream stream ended before [DONE]")


async def post_json(client: UpstreamClient, path: str, body: dict[str, Any], state: CallState, *, provider: str,
                    key: Secret | None) -> Any:
    """POST ``body`` upstream and return the decoded JSON answer; ``state.sent`` is set before the bytes leave.

    Once the request has left, only a whole JSON answer counts as one: a body that does not parse (cut where
    the connection's close framed it, or garbage) is ``UpstreamLostError``, since the model may have run.
    """
    payload = orjson.dumps(body)
    state.sent = True
    response = await client.post(path, payload)
    await raise_for_status(response, provider, key)
    raw = await response.read()
    try:
        return orjson.loads(raw)
    except ValueError as exc:
        raise UpstreamLostError(f"{provider}: upstream answer is not whole JSON ({len(raw)} bytes)") from exc


async def stream_json_events(client: UpstreamClient, path: str, body: dict[str, Any], state: CallState,
                             feed: Callable[[dict[str, Any]], Iterable[StreamEvent]], *, provider: str,
                             key: Secret | None, until_done: bool = False) -> AsyncIterator[StreamEvent]:
    """POST ``body`` upstream and pass each SSE JSON event through ``feed`` as it arrives (``until_done``: the
    stream must end with ``[DONE]``, as OpenAI-compatible ones do)."""
    payload = orjson.dumps(body)
    state.sent = True
    response = await client.post(path, payload)
    try:
        await raise_for_status(response, provider, key)
        async for _, data in sse_events(response, until_done=until_done):
            if isinstance(data, dict):
                for event in feed(data):
                    yield event
    finally:
        await response.aclose()
