"""A stream's worker going away, straight through the broker's ASGI app as uvicorn calls it (ASGI 2.3: the
server says ``http.disconnect`` when the client is gone, and also once the answer is complete).

A worker gone mid-stream, while the upstream is silent, ends the stream at once: its hold is ``unknown`` (bytes
were sent, the model may go on costing) and the upstream call is closed. A worker that read the whole answer
and then hears the server's ``http.disconnect`` (uvicorn says it once the answer is complete) leaves its hold
settled.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, MutableMapping
from pathlib import Path
from typing import Any

from conftest import claimed_worker
from swarmyard.broker import BrokerSettings, ModelRoute, create_broker_app
from swarmyard.broker.chat import (
    ChatRequest,
    ChatResponse,
    Finished,
    FinishReason,
    StreamEvent,
    TextDelta,
    Usage,
)
from swarmyard.broker.providers.protocol import CallState
from swarmyard.broker.tokencount import TokenCounter
from swarmyard.clock import FakeClock
from swarmyard.domain import ReservationState
from swarmyard.store import open_store

#: a bound on a test that would otherwise hang, not a timing assertion
_HANG_S = 60.0


class _Stalling:
    """Streams one event, then (``stall``) waits for ever, or finishes with its usage; records its close."""

    name = "stalling"

    def __init__(self, *, stall: bool) -> None:
        self.stall = stall
        self.closed = asyncio.Event()

    def counter(self, model: str) -> TokenCounter | None:
        return None

    async def complete(self, request: ChatRequest, state: CallState) -> ChatResponse:
        raise AssertionError("only streams are asked of this provider")

    async def stream(self, request: ChatRequest, state: CallState) -> AsyncGenerator[StreamEvent, None]:
        state.sent = True
        try:
            yield TextDelta("the first words")
            if self.stall:
                await asyncio.Event().wait()  # an upstream that goes quiet
            yield Finished(FinishReason.STOP, Usage(5, 3))
        finally:
            self.closed.set()

    async def aclose(self) -> None:
        pass


def _serve_one(tmp_path: Path, provider: _Stalling, *, gone_after_first_chunk: bool) -> tuple[list[bytes], str]:
    """One streamed call through the app; the worker goes away after the first body chunk (or is told the
    answer is complete once it is). Returns the body chunks sent and the hold's state."""
    clock = FakeClock()
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}", clock=clock)
    worker = claimed_worker(store, clock, secret=b"d" * 32, budget=10_000_000, call_cap=10)
    route = ModelRoute("m", provider.name, input_per_mtok=1_000_000, output_per_mtok=1_000_000)
    app = create_broker_app(store, worker.tokens, {provider.name: provider}, BrokerSettings(routes=(route,)), clock)
    body = json.dumps({"model": "m", "max_tokens": 10, "stream": True,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": "POST", "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
        "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
        "headers": [(b"authorization", f"Bearer {worker.token}".encode()), (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())],
    }
    chunks: list[bytes] = []

    async def main() -> None:
        gone = asyncio.Event()
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] != "http.response.body":
                return
            chunks.append(message.get("body", b""))
            if gone_after_first_chunk or not message.get("more_body", False):
                gone.set()

        await asyncio.wait_for(app(scope, receive, send), _HANG_S)
        await asyncio.wait_for(provider.closed.wait(), _HANG_S)
        await app.state.broker.aclose()

    try:
        asyncio.run(main())
        [reservation] = store.list_reservations(worker.goal_id)
        return chunks, reservation.state.value
    finally:
        store.close()


def test_a_worker_gone_mid_stream_ends_it_unknown_and_closes_the_upstream(tmp_path: Path) -> None:
    provider = _Stalling(stall=True)
    chunks, state = _serve_one(tmp_path, provider, gone_after_first_chunk=True)
    assert b"the first words" in b"".join(chunks)
    assert b"[DONE]" not in b"".join(chunks)
    assert state == ReservationState.UNKNOWN.value
    assert provider.closed.is_set()


def test_a_whole_stream_then_the_servers_disconnect_settles(tmp_path: Path) -> None:
    provider = _Stalling(stall=False)
    chunks, state = _serve_one(tmp_path, provider, gone_after_first_chunk=False)
    assert b"".join(chunks).rstrip().endswith(b"data: [DONE]")
    assert state == ReservationState.SETTLED.value
