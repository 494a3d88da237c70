"""Every hold the broker takes ends settled, released or ``unknown``, over real HTTP: an answer that cannot be
rendered, the same body resent after its call went ``unknown``, and an HTTP/1.0 upstream that closes after
every answer."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import claimed_worker
from loopback import serve_in_thread
from rigs.network import http_server
from swarmyard.broker import BrokerSettings, ModelRoute, create_broker_app
from swarmyard.broker.app import Broker
from swarmyard.broker.providers.openai_compat import OpenAICompatProvider
from swarmyard.broker.providers.protocol import Provider
from swarmyard.broker.providers.scripted import Fail, FailKind, Say, ScriptedProvider
from swarmyard.broker.providers.upstream import Timeouts
from swarmyard.clock import FakeClock
from swarmyard.domain import ReservationState
from swarmyard.store import SqlStore, open_store

#: A Python string orjson refuses to write: the answer came back, but cannot be passed on.
UNWRITABLE = "half a pair: \ud800"


@dataclass
class Rig:
    url: str
    store: SqlStore
    store_url: str
    goal_id: str
    headers: dict[str, str]
    broker: Broker

    def ask(self, content: str, *, stream: bool = False, path: str = "/v1/chat/completions") -> httpx.Response:
        body: dict[str, Any] = {"model": "m", "stream": stream}
        if path == "/v1/responses":
            body |= {"max_output_tokens": 16, "input": content}
        else:
            body |= {"max_tokens": 10, "messages": [{"role": "user", "content": content}]}
        return httpx.post(f"{self.url}{path}", json=body, headers=self.headers, timeout=30)

    def states(self) -> list[ReservationState]:
        assert self.broker.wait_settled(10)
        return [r.state for r in self.store.list_reservations(self.goal_id)]


def _rig(tmp_path: Path, provider: Provider) -> Iterator[Rig]:
    clock = FakeClock()
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(store_url, clock=clock)
    worker = claimed_worker(store, clock, secret=b"o" * 32, budget=10_000_000, call_cap=1000)
    route = ModelRoute("m", provider.name, upstream_model="up", input_per_mtok=1_000_000, output_per_mtok=1_000_000)
    app = create_broker_app(store, worker.tokens, {provider.name: provider}, BrokerSettings(routes=(route,)), clock)
    with serve_in_thread(app) as url:
        yield Rig(url, store, store_url, worker.goal_id, {"authorization": f"Bearer {worker.token}"},
                  app.state.broker)
    store.close()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swarmyard.cli", *args], capture_output=True, text=True,
                          timeout=120)


# -- an answer that cannot be rendered ----------------------------------------------------------------------


@pytest.fixture
def unwritable(tmp_path: Path) -> Iterator[Rig]:
    script = ScriptedProvider({"*": [Say(UNWRITABLE, input_tokens=5, output_tokens=2)] * 4}, name="script")
    yield from _rig(tmp_path, script)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/messages"])
def test_an_answer_that_cannot_be_rendered_is_billed_and_never_left_held(unwritable: Rig, path: str) -> None:
    answered = unwritable.ask("hi", path=path)
    # not a bare 500: a typed error that says the call was billed and must not be sent again
    assert answered.status_code == 502, answered.text
    assert "provider_error" in answered.text and answered.headers["x-should-retry"] == "false"
    # its usage is known (the upstream reported it): settled at it
    [settled] = unwritable.store.list_reservations(unwritable.goal_id)
    assert unwritable.states() == [ReservationState.SETTLED] and settled.id
    assert unwritable.store.get_reservation(settled.id).actual == 7


def test_a_stream_that_cannot_be_rendered_ends_unknown(unwritable: Rig) -> None:
    answered = unwritable.ask("hi", stream=True)
    assert answered.status_code == 200  # the stream had begun: its last event carries the error
    assert "upstream_unknown" in answered.text
    assert unwritable.states() == [ReservationState.UNKNOWN]


def test_a_worker_gone_before_its_stream_began_leaves_the_hold_unknown(tmp_path: Path) -> None:
    # Straight through the broker's ASGI app, as the server calls it: the worker's connection is gone when the
    # answer's head is written, so not one frame is ever asked for.
    clock = FakeClock()
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}", clock=clock)
    worker = claimed_worker(store, clock, secret=b"g" * 32, budget=10_000_000, call_cap=10)
    script = ScriptedProvider({"*": [Say("never read", input_tokens=5, output_tokens=2)]}, name="script")
    route = ModelRoute("m", "script", input_per_mtok=1_000_000, output_per_mtok=1_000_000)
    app = create_broker_app(store, worker.tokens, {"script": script}, BrokerSettings(routes=(route,)), clock)
    body = json.dumps({"model": "m", "max_tokens": 10, "stream": True,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
        "method": "POST", "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
        "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
        "headers": [(b"authorization", f"Bearer {worker.token}".encode()), (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())],
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            raise OSError("the worker's connection is closed")

    async def main() -> None:
        with pytest.raises(Exception):  # noqa: B017 (whatever the server makes of the closed connection)
            await app(scope, receive, send)
        await app.state.broker.aclose()

    try:
        asyncio.run(main())
        assert [r.state for r in store.list_reservations(worker.goal_id)] == [ReservationState.UNKNOWN]
    finally:
        store.close()


# -- the same body again after its call went unknown ---------------------------------------------------------


@pytest.fixture
def lossy(tmp_path: Path) -> Iterator[tuple[Rig, ScriptedProvider]]:
    script = ScriptedProvider({"*": [Fail(FailKind.AFTER_SEND)] + [Say("ok", input_tokens=5, output_tokens=1)] * 5},
                              name="script")
    for rig in _rig(tmp_path, script):
        yield rig, script


def test_a_resent_body_of_an_unknown_call_is_refused_unsent_until_reconciled(
        lossy: tuple[Rig, ScriptedProvider]) -> None:
    rig, script = lossy
    lost = rig.ask("the call that was lost")
    assert lost.status_code == 502 and lost.json()["error"]["code"] == "upstream_unknown"
    reservation_id = lost.json()["error"]["reservation_id"]
    # the very same bytes, again, and to another endpoint
    for path in ("/v1/chat/completions", "/v1/chat/completions", "/v1/messages"):
        again = rig.ask("the call that was lost", path=path)
        assert again.status_code == 409, again.text
        error = again.json()["error"]
        assert error["code"] == "duplicate_of_unknown" and error["reservation_id"] == reservation_id
        assert error["retryable"] is False and again.headers["x-should-retry"] == "false"
    # nothing held, nothing sent for the resends
    assert len(script.requests) == 1
    assert rig.states() == [ReservationState.UNKNOWN]
    # another body goes through
    assert rig.ask("a new question").status_code == 200
    assert len(script.requests) == 2
    # once the operator reconciled the lost call, the body may be sent again
    done = _cli("budget", "reconcile", reservation_id, "--release", "--store", rig.store_url)
    assert done.returncode == 0, done.stderr
    assert rig.ask("the call that was lost").status_code == 200
    assert sorted(rig.states()) == sorted([ReservationState.RELEASED] + [ReservationState.SETTLED] * 2)


# -- an HTTP/1.0 upstream ------------------------------------------------------------------------------------

_ANSWER = json.dumps({"id": "c1", "object": "chat.completion", "model": "up",
                      "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
                      "choices": [{"index": 0, "finish_reason": "stop",
                                   "message": {"role": "assistant", "content": "hello"}}]}).encode()


class _Http10(BaseHTTPRequestHandler):
    """Answers every POST whole, as HTTP/1.0 without keep-alive: the server closes after each answer."""

    protocol_version = "HTTP/1.0"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(_ANSWER)))
        self.end_headers()
        self.wfile.write(_ANSWER)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def http10(tmp_path: Path) -> Iterator[Rig]:
    with http_server(_Http10) as upstream:
        provider = OpenAICompatProvider(f"{upstream}/v1", None, name="oa",
                                        timeouts=Timeouts(connect_s=5, read_s=10))
        yield from _rig(tmp_path, provider)


def test_every_call_to_an_http10_upstream_settles(http10: Rig) -> None:
    with httpx.Client(base_url=http10.url, headers=http10.headers, timeout=30) as client:
        for n in range(200):
            body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": f"call {n}"}]}
            answered = client.post("/v1/chat/completions", json=body)
            assert answered.status_code == 200, (n, answered.text)
    assert http10.states() == [ReservationState.SETTLED] * 200
