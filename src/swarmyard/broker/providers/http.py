"""What the HTTP upstream providers share: status checks, SSE reading, scrubbing.

An upstream is read in bounded amounts: an error body's first ``ERROR_PREFIX_BYTES`` (its connection closed
after), a whole answer or a stream up to ``upstream.BODY_LIMIT_BYTES``. What it answers is scrubbed of every
held key before a format parser sees it; its error text goes to the log, never to the worker.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any

import orjson

from swarmyard.broker.keys import KeyForms, held_forms
from swarmyard.broker.providers.upstream import BODY_LIMIT_BYTES, UpstreamClient, UpstreamResponse
from swarmyard.errors import ContextLengthError, ProviderError, UpstreamLostError

if TYPE_CHECKING:
    from swarmyard.broker.chat import StreamEvent
    from swarmyard.broker.providers.protocol import CallState

log = logging.getLogger(__name__)

_RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
_DRAIN_S = 1.0


#: The most of an error body the broker reads; the rest is not read, and its connection is closed.
ERROR_PREFIX_BYTES = 64 << 10
#: An upstream error type or code that may go to the worker (when it holds no piece of a key).
_SAFE_CODE = re.compile(r"[a-z0-9_.-]{1,64}")
_LOGGED_CHARS = 4096  # of an error body's scrubbed text


#: How OpenAI (and compatibles), llama.cpp and Anthropic say a prompt does not fit the context window.
_CONTEXT_MARKERS = ("context_length_exceeded", "exceed_context_size_error", "prompt is too long")


def _int_field(raw: str, name: str) -> int | None:
    found = re.search(rf'"{name}"\s*:\s*(\d+)', raw)
    return int(found.group(1)) if found else None


async def _prefix(response: UpstreamResponse, limit: int) -> bytes:
    """At most ``limit`` bytes of the body; a body longer than that is not read on, and its connection is
    closed instead of going back to the pool (``aclose`` before the end)."""
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in response.chunks():
            parts.append(chunk)
            size += len(chunk)
            if size >= limit:
                break
    finally:
        await response.aclose()
    return b"".join(parts)[:limit]


def _error_code(raw: str, forms: KeyForms) -> str | None:
    """The upstream's error type or code (``{"error": {"type": ...}}``, OpenAI's and Anthropic's shape) when it
    is a short token holding no piece of a key: all of its text the worker may see."""
    try:
        body = orjson.loads(raw)
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None
    for name in ("type", "code"):
        token = error.get(name)
        if isinstance(token, str) and _SAFE_CODE.fullmatch(token) and not forms.shares_piece(token):
            return token
    return None


async def raise_for_status(response: UpstreamResponse, provider: str) -> None:
    """Turn an upstream error status into ``ProviderError`` (the answer came back: nothing to bill).

    The worker gets a fixed message (the provider, the status, at most a safe error code): an error body is
    free text an upstream writes, and no scrubbing finds every way it could spell a key (split across fields,
    in an encoding nobody listed). The text, scrubbed, goes to the broker's log (its first 4 KiB).
    """
    if response.status < 400:
        return
    try:
        raw = (await _prefix(response, ERROR_PREFIX_BYTES)).decode("utf-8", "replace")
    except UpstreamLostError:
        raw = ""
    if response.status == 400 and any(marker in raw for marker in _CONTEXT_MARKERS):
        # the worker's conversation is too long for the model: its own error to fix, not the provider's
        raise ContextLengthError(provider, _int_field(raw, "n_prompt_tokens"), _int_field(raw, "n_ctx"))
    forms = held_forms()  # the provider's own key among them: a ``Secret`` is held while it lives
    text = forms.scrub(raw)
    # bounded: a log line is written on the event loop, and a pipe nobody drains blocks it once full
    log.warning("%s: upstream answered %d (%d bytes read): %r", provider, response.status, len(raw),
                text[:_LOGGED_CHARS])
    code = _error_code(raw, forms)
    raise ProviderError(
        f"{provider}: upstream answered {response.status}" + (f" ({code})" if code else ""),
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


async def post_json(client: UpstreamClient, path: str, body: dict[str, Any], state: CallState, *,
                    provider: str) -> Any:
    """POST ``body`` upstream and return the decoded JSON answer, every string in it scrubbed of every held key
    (``keys.scrubbed``); ``state.sent`` is set before the bytes leave.

    Once the request has left, only a whole JSON answer counts as one: a body that does not parse (cut where
    the connection's close framed it, or garbage) is ``UpstreamLostError``, since the model may have run.
    """
    payload = orjson.dumps(body)
    state.sent = True
    response = await client.post(path, payload)
    await raise_for_status(response, provider)
    length = response.headers.get("content-length", "")
    if length.isdigit() and int(length) > BODY_LIMIT_BYTES:
        await response.aclose()
        raise UpstreamLostError(f"{provider}: upstream answer is longer than {BODY_LIMIT_BYTES} bytes")
    raw = await response.read()  # bounded by the client, whatever the framing
    try:
        answer = orjson.loads(raw)
    except ValueError as exc:
        raise UpstreamLostError(f"{provider}: upstream answer is not whole JSON ({len(raw)} bytes)") from exc
    return held_forms().scrubbed(answer)


async def stream_json_events(client: UpstreamClient, path: str, body: dict[str, Any], state: CallState,
                             feed: Callable[[dict[str, Any]], Iterable[StreamEvent]], *, provider: str,
                             until_done: bool = False) -> AsyncIterator[StreamEvent]:
    """POST ``body`` upstream and pass each SSE JSON event through ``feed`` as it arrives (``until_done``: the
    stream must end with ``[DONE]``, as OpenAI-compatible ones do)."""
    payload = orjson.dumps(body)
    state.sent = True
    response = await client.post(path, payload)
    try:
        await raise_for_status(response, provider)
        async for _, data in sse_events(response, until_done=until_done):
            if isinstance(data, dict):
                for event in feed(data):
                    yield event
    finally:
        await response.aclose()
