"""A stream whose first event is slow to come is kept alive in its format's way, and the caller's agent CLI is
known to the provider.

A real broker served on loopback TCP (uvicorn, ``BackgroundServer``), a real HTTP client streaming from it, and a
loopback upstream (``rigs.upstream.RawUpstream``, the test double for a paid provider) that holds its answer until
the test lets it go. The broker's keep-alive interval is made short (no sleep stands in for a wait: the test lets
the upstream answer only after it has read keep-alives off the stream). Checked: the keep-alives are Anthropic
``ping`` events on ``/v1/messages`` and SSE comments on ``/v1/chat/completions``, the answer after them is whole
and parses, the upstream saw the request once, and the hold is settled with the upstream's usage (not released, not
unknown); a request the upstream fails after keep-alives were sent ends the stream with the format's error event
and its hold unknown, and a resend of the same body is refused.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import ClaimedWorker, claimed_worker
from rigs.upstream import Answer, RawUpstream, completion_saying
from swarmyard.broker import BrokerSettings, ModelRoute, create_broker_app
from swarmyard.broker.chat import ChatRequest, ChatResponse
from swarmyard.broker.keepalive import ANTHROPIC_PING, SSE_COMMENT
from swarmyard.broker.providers.openai_compat import OpenAICompatProvider
from swarmyard.broker.providers.protocol import CallState
from swarmyard.clock import FakeClock
from swarmyard.domain import ReservationState
from swarmyard.plane.server import BackgroundServer, Listen
from swarmyard.store import SqlStore, open_store

ANSWER = "The answer came after a long think."


class Held:
    """The upstream's behaviour: each request waits until the test lets it go, then is answered (or dropped)."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.arrived = threading.Event()
        self.drop = False

    def __call__(self, body: dict[str, Any]) -> Answer:
        self.arrived.set()
        assert self.go.wait(60), "the test never let the upstream answer"
        return None if self.drop else (b"200 OK", completion_saying(body["model"], ANSWER))


class Watching(OpenAICompatProvider):
    """The openai-compatible provider, noting the agent CLI the broker said each call came from."""

    agents: list[str]

    async def complete(self, request: ChatRequest, state: CallState) -> ChatResponse:
        self.agents.append(state.agent)
        return await super().complete(request, state)

    def stream(self, request: ChatRequest, state: CallState):  # type: ignore[no-untyped-def]
        self.agents.append(state.agent)
        return super().stream(request, state)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    opened = open_store(f"sqlite:///{tmp_path / 'store.db'}", clock=FakeClock())
    yield opened
    opened.close()


@pytest.fixture
def rig(store: SqlStore) -> Iterator[tuple[str, ClaimedWorker, Held, RawUpstream, Watching, Any]]:
    held = Held()
    upstream = RawUpstream(held)
    provider = Watching(f"http://127.0.0.1:{upstream.port}/v1", None, name="up")
    provider.agents = []
    worker = claimed_worker(store, FakeClock(), secret=b"k" * 32)
    settings = BrokerSettings(routes=(ModelRoute("m", "up", input_per_mtok=1, output_per_mtok=1),))
    app = create_broker_app(store, worker.tokens, {"up": provider}, settings)
    app.state.broker.keep_alive_s = 0.2
    with BackgroundServer(app, Listen(socket_path=None, tcp_host="127.0.0.1", tcp_port=0)) as server:
        yield f"http://127.0.0.1:{server.tcp_port}", worker, held, upstream, provider, app.state.broker
    held.go.set()
    upstream.close()


def _read_until(lines: Iterator[str], wanted: str, seen: list[str]) -> None:
    for line in lines:
        seen.append(line)
        if line == wanted:
            return
    raise AssertionError(f"the stream ended before {wanted!r}: {seen}")


@pytest.mark.parametrize(("path", "keep_alive", "agent"), [
    ("/v1/messages", ANTHROPIC_PING, ("claude-cli/2.1.197 (external, cli)", "claude")),
    ("/v1/chat/completions", SSE_COMMENT, ("python-httpx/0.28", "")),
])
def test_a_slow_first_event_is_kept_alive_and_the_answer_still_comes_whole(
        rig: tuple[str, ClaimedWorker, Held, RawUpstream, Watching, Any], store: SqlStore, path: str,
        keep_alive: bytes, agent: tuple[str, str]) -> None:
    base, worker, held, upstream, provider, broker = rig
    body: dict[str, Any] = {"model": "m", "max_tokens": 50, "stream": True,
                            "messages": [{"role": "user", "content": "Think long."}]}
    headers = {"authorization": f"Bearer {worker.token}", "user-agent": agent[0]}
    ping_line = keep_alive.decode().splitlines()[0]
    seen: list[str] = []
    with httpx.Client(base_url=base, timeout=60) as client, \
            client.stream("POST", path, json=body, headers=headers) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        _read_until(lines, ping_line, seen)  # a keep-alive while the upstream holds its answer...
        _read_until(lines, ping_line, seen)  # ...and another: they go on while it waits
        assert held.arrived.is_set() and not held.go.is_set()
        held.go.set()
        seen += list(lines)
    text = "\n".join(seen)
    if path == "/v1/messages":
        events = [json.loads(line[6:]) for line in seen if line.startswith("data: ")]
        assert events[0]["type"] == "message_start" and {"type": "ping"} in events
        said = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
        assert said == ANSWER and events[-1]["type"] == "message_stop"
    else:
        chunks = [json.loads(line[6:]) for line in seen if line.startswith("data: {")]
        said = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert said == ANSWER and [line for line in seen if line][-1] == "data: [DONE]" and ": keep-alive" in text
    assert upstream.posts["m"] == 1 and provider.agents == [agent[1]]
    assert broker.wait_settled(10)
    [hold] = store.list_reservations(worker.goal_id)
    assert hold.state is ReservationState.SETTLED and (hold.input_tokens, hold.output_tokens) == (100, 20)


def test_a_failure_after_keep_alives_ends_the_stream_with_an_error_and_the_hold_unknown(
        rig: tuple[str, ClaimedWorker, Held, RawUpstream, Watching, Any], store: SqlStore) -> None:
    base, worker, held, upstream, _, broker = rig
    held.drop = True  # the request arrives whole, and its answer is lost
    body: dict[str, Any] = {"model": "m", "max_tokens": 50, "stream": True,
                            "messages": [{"role": "user", "content": "Think long."}]}
    headers = {"authorization": f"Bearer {worker.token}"}
    seen: list[str] = []
    with httpx.Client(base_url=base, timeout=60) as client:
        with client.stream("POST", "/v1/messages", json=body, headers=headers) as response:
            lines = response.iter_lines()
            _read_until(lines, "event: ping", seen)
            held.go.set()
            seen += list(lines)
        assert "event: error" in seen, seen
        [error] = [json.loads(line[6:]) for line in seen if line.startswith("data: ") and '"error"' in line]
        assert error["error"]["type"] == "upstream_unknown" or "upstream_unknown" in json.dumps(error)
        assert broker.wait_settled(10)
        [hold] = store.list_reservations(worker.goal_id)
        assert hold.state is ReservationState.UNKNOWN
        # the same body again is not sent on: its first answer may have been billed
        again = client.post("/v1/messages", json=body, headers=headers)
        assert again.status_code >= 400 and upstream.posts["m"] == 1, again.text
