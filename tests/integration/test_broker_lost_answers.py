"""Once the request has left, only a whole, well-formed answer settles: a cut, garbled or ill-typed one is
``unknown`` (never released), answered ``upstream_unknown`` with ``x-should-retry: false``, and
``swarmyard budget reconcile`` (the console script) brings the envelopes back exactly, on SQLite and PostgreSQL.

The upstream is a bare asyncio HTTP/1.1 server on loopback whose answer is chosen by the requested model.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from rigs.broker import loopback_broker
from rigs.network import stream_server
from swarmyard.broker import ModelRoute
from swarmyard.broker.app import Broker
from swarmyard.broker.providers.anthropic import AnthropicProvider
from swarmyard.broker.providers.openai_compat import OpenAICompatProvider
from swarmyard.broker.providers.upstream import Timeouts
from swarmyard.domain import ReservationState
from swarmyard.store import SqlStore

_USAGE = {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30}
_WHOLE = json.dumps({"id": "c1", "object": "chat.completion", "model": "m", "usage": _USAGE,
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": "a whole answer"}}]}).encode()
_CONTENT_123 = _WHOLE.replace(b'"a whole answer"', b"123")
_EVENTS = [b'data: {"choices":[{"index":0,"delta":{"content":"a "}}]}\n\n',
           b'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\n\n',
           b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
           b'data: {"choices":[],"usage":' + json.dumps(_USAGE).encode() + b"}\n\n",
           b"data: [DONE]\n\n"]
_SSE = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"  # framed by the connection's close

#: What the upstream writes for each model, then closes the connection.
ANSWERS: dict[str, bytes] = {
    # whole answers: these settle, framed by length or by the close
    "up-whole": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n" + _WHOLE,
    "up-whole-stream": _SSE + b"".join(_EVENTS),
    # cut where the close frames the body: it reads as a shorter body, which must not be taken for an answer
    "up-cut-close": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n" + _WHOLE[: len(_WHOLE) // 2],
    "up-cut-length": b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(_WHOLE) + _WHOLE[:40],
    "up-garbage-body": b"HTTP/1.1 200 OK\r\ncontent-length: 17\r\n\r\n<html>oops</html>",
    "up-garbage-length": b"HTTP/1.1 200 OK\r\ncontent-length: lots\r\n\r\n" + _WHOLE,
    "up-garbage-chunks": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n" + _WHOLE,
    "up-garbage-head": b"\x16\x03\x01 definitely not http\r\n\r\n",
    "up-content-123": b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(_CONTENT_123) + _CONTENT_123,
    # streams cut before their end: mid-event, between events, after the finish but before [DONE]
    "up-stream-mid-event": _SSE + _EVENTS[0] + _EVENTS[1][:20],
    "up-stream-between": _SSE + _EVENTS[0] + _EVENTS[1],
    "up-stream-no-done": _SSE + b"".join(_EVENTS[:4]),
    "up-stream-garbage": _SSE + b"data: {this is not json\n\n",
    "up-stream-content-123": _SSE + _EVENTS[0] + b'data: {"choices":[{"index":0,"delta":{"content":123}}]}\n\n'
    + b"".join(_EVENTS[2:]),
}
#: Anthropic Messages upstream answers (the path says which API was asked).
MESSAGES: dict[str, bytes] = {
    "up-text-123": b"HTTP/1.1 200 OK\r\n\r\n" + json.dumps(
        {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "end_turn",
         "content": [{"type": "text", "text": 123}], "usage": {"input_tokens": 3, "output_tokens": 2}}).encode(),
    "up-stream-error": _SSE + (
        b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":3}}}\n\n'
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"partial"}}\n\n'
        b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n'),
    "up-stream-text-123": _SSE + (
        b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":3}}}\n\n'
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":123}}\n\n'
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'),
}
WHOLE = ("whole", "whole-stream")
LOST = tuple(name.removeprefix("up-") for name in ANSWERS if name.removeprefix("up-") not in WHOLE)
LOST_MESSAGES = tuple(name.removeprefix("up-") for name in MESSAGES)


@dataclass
class Upstream:
    posts: Counter[str] = field(default_factory=Counter)
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            body = json.loads(await reader.readexactly(length))
            self.posts[body["model"]] += 1
            table = MESSAGES if b" /v1/messages " in head.split(b"\r\n")[0] + b" " else ANSWERS
            writer.write(table[body["model"]])
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    with stream_server(up.handle) as up.port:
        yield up


@dataclass
class Rig:
    url: str
    store: SqlStore
    store_url: str
    token: str
    goal_id: str
    task_id: str
    broker: Broker


@pytest.fixture
def rig(store_url: str, upstream: Upstream) -> Iterator[Rig]:
    timeouts = Timeouts(connect_s=2, read_s=5)
    providers = {
        "oa": OpenAICompatProvider(f"http://127.0.0.1:{upstream.port}/v1", None, name="oa", timeouts=timeouts),
        "an": AnthropicProvider(f"http://127.0.0.1:{upstream.port}", None, name="an", timeouts=timeouts),
    }
    routes = tuple(ModelRoute(name, "oa", upstream_model=f"up-{name}", input_per_mtok=1_000_000,
                              output_per_mtok=1_000_000) for name in (*WHOLE, *LOST))
    routes += tuple(ModelRoute(name, "an", upstream_model=f"up-{name}", input_per_mtok=1_000_000,
                               output_per_mtok=1_000_000) for name in LOST_MESSAGES)
    with loopback_broker(store_url, providers, routes, secret=b"u" * 32, budget=1_000_000, call_cap=1000) as on:
        worker = on.worker
        yield Rig(on.url, on.store, store_url, worker.token, worker.goal_id, worker.task_id, on.broker)


def _ask(rig: Rig, model: str) -> httpx.Response:
    stream = "stream" in model
    body = {"model": model, "max_tokens": 50, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(f"{rig.url}/v1/chat/completions", json=body, timeout=30,
                      headers={"authorization": f"Bearer {rig.token}"})


def _streamed_text(answered: httpx.Response) -> str:
    chunks = [json.loads(line[6:]) for line in answered.text.splitlines() if line.startswith("data: {")]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swarmyard.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_only_a_whole_answer_settles_and_reconcile_restores_the_envelopes(rig: Rig, upstream: Upstream) -> None:
    for model in WHOLE:
        answered = _ask(rig, model)
        assert answered.status_code == 200, answered.text
        # a stream's deltas may reach the worker joined (the broker holds back text a key could be split across)
        assert "a whole answer" in answered.text or _streamed_text(answered) == "a b"
    for model in (*LOST, *LOST_MESSAGES):
        answered = _ask(rig, model)
        if answered.status_code == 200:
            # the stream had begun: its end carries the error, in the format the worker asked for
            assert "upstream_unknown" in answered.text.splitlines()[-2], (model, answered.text)
        else:
            assert answered.status_code == 502, (model, answered.text)
            assert answered.json()["error"]["code"] == "upstream_unknown", (model, answered.text)
            assert answered.json()["error"]["retryable"] is False
            assert answered.headers["x-should-retry"] == "false"
    # the broker never asked twice
    assert upstream.posts == Counter({f"up-{model}": 1 for model in (*WHOLE, *LOST, *LOST_MESSAGES)})
    assert rig.broker.wait_settled(10)
    reservations = {r.model: r for r in rig.store.list_reservations(rig.goal_id)}
    assert {m: r.state for m, r in reservations.items()} == {
        **{m: ReservationState.SETTLED for m in WHOLE},
        **{m: ReservationState.UNKNOWN for m in (*LOST, *LOST_MESSAGES)},
    }
    settled = sum(reservations[m].actual or 0 for m in WHOLE)
    assert settled == 2 * 30  # the upstream's usage at 1 micro-USD a token
    goal = rig.store.get_goal(rig.goal_id)
    unknown = [reservations[m] for m in (*LOST, *LOST_MESSAGES)]
    assert goal.envelope.reserved == sum(r.amount for r in unknown) > 0
    # the operator settles one lost call at its real cost and releases the rest, through the console script
    store = rig.store_url
    done = _cli("budget", "reconcile", unknown[0].id, "--actual", "17", "--store", store)
    assert done.returncode == 0, done.stderr
    for reservation in unknown[1:]:
        done = _cli("budget", "reconcile", reservation.id, "--release", "--store", store)
        assert done.returncode == 0, done.stderr
    again = _cli("budget", "reconcile", unknown[0].id, "--actual", "17", "--store", store)
    assert again.returncode == 1 and "cannot go from settled" in again.stderr  # settled once, refused after
    shown = _cli("budget", "show", rig.goal_id, "--json", "--store", store)
    assert shown.returncode == 0, shown.stderr
    budget = json.loads(shown.stdout)
    assert budget["goal"]["reserved"] == 0 and budget["tasks"][rig.task_id]["reserved"] == 0
    assert budget["goal"]["settled"] == settled + 17 == budget["tasks"][rig.task_id]["settled"]
    assert budget["available"] == 1_000_000 - settled - 17
