"""A real upstream HTTP server that drops, times out, answers 500 and 429: the ledger stays exact and safe."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from rigs.broker import loopback_broker
from rigs.network import stream_server
from swarmyard.broker import ModelRoute
from swarmyard.broker.app import Broker
from swarmyard.broker.keys import Secret
from swarmyard.broker.providers.openai_compat import OpenAICompatProvider
from swarmyard.broker.providers.upstream import Timeouts
from swarmyard.domain import ReservationState
from swarmyard.store import SqlStore

UPSTREAM_KEY = "sk-upstream-DO-NOT-LEAK-7f3a9c"


@dataclass
class Upstream:
    """A bare asyncio HTTP/1.1 server whose behaviour is chosen by the requested model."""

    hits: Counter[str] = field(default_factory=Counter)
    bad_auth: int = 0
    port: int = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
                body = json.loads(await reader.readexactly(int(headers.get("content-length", "0"))))
                if headers.get("authorization") != f"Bearer {UPSTREAM_KEY}":
                    self.bad_auth += 1
                model = body["model"]
                self.hits[model] += 1
                if not await self._answer(model, bool(body.get("stream")), writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    async def _answer(self, model: str, stream: bool, writer: asyncio.StreamWriter) -> bool:
        usage = {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30}
        if model == "up-drop" and not stream:
            writer.transport.abort()  # the request arrived; the answer never will
            return False
        if model == "up-slow":
            await asyncio.sleep(30)
            return False
        if model in ("up-500", "up-429"):
            status = 500 if model == "up-500" else 429
            payload = json.dumps({"error": {"message": f"upstream says {status}"}}).encode()
            writer.write(f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: "
                         f"{len(payload)}\r\n\r\n".encode() + payload)
            await writer.drain()
            return True
        if not stream:
            payload = json.dumps({"id": "c1", "object": "chat.completion", "model": model, "usage": usage,
                                  "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": "fine"}}]}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                         + str(len(payload)).encode() + b"\r\n\r\n" + payload)
            await writer.drain()
            return True
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        chunks = [{"choices": [{"index": 0, "delta": {"content": word}}]} for word in ("a ", "b ", "c")]
        for number, chunk in enumerate(chunks):
            if model == "up-drop" and number == 2:
                await writer.drain()
                writer.transport.abort()
                return False
            data = b"data: " + json.dumps(chunk).encode() + b"\n\n"
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        tail = (b"data: " + json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}).encode()
                + b"\n\ndata: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n")
        writer.write(f"{len(tail):x}\r\n".encode() + tail + b"\r\n0\r\n\r\n")
        await writer.drain()
        return True


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    with stream_server(up._handle) as up.port:
        yield up


@dataclass
class Rig:
    url: str
    store: SqlStore
    token: str
    goal_id: str
    task_id: str
    db: Path
    broker: Broker


@pytest.fixture
def rig(tmp_path: Path, upstream: Upstream) -> Iterator[Rig]:
    db = tmp_path / "store.db"
    provider = OpenAICompatProvider(f"http://127.0.0.1:{upstream.port}/v1", Secret(UPSTREAM_KEY), name="up",
                                    timeouts=Timeouts(connect_s=2, read_s=0.3))
    routes = tuple(ModelRoute(name, "up", upstream_model=f"up-{name}", input_per_mtok=1_000_000,
                              output_per_mtok=1_000_000) for name in ("ok", "drop", "slow", "500", "429"))
    with loopback_broker(f"sqlite:///{db}", {"up": provider}, routes, secret=b"k" * 32, budget=20_000,
                         call_cap=1000) as on:
        worker = on.worker
        yield Rig(on.url, on.store, worker.token, worker.goal_id, worker.task_id, db, on.broker)


def _states(rig: Rig) -> Counter[str]:
    assert rig.broker.wait_settled(10)  # settlement is written after the answer went out
    return Counter(r.state.value for r in rig.store.list_reservations(rig.goal_id))


def test_sdks_do_not_resend_after_a_drop(rig: Rig, upstream: Upstream) -> None:
    oa = openai.OpenAI(base_url=f"{rig.url}/v1", api_key=rig.token, max_retries=2)
    with pytest.raises(openai.APIStatusError) as caught:
        oa.chat.completions.create(model="drop", max_tokens=100, messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 502
    assert caught.value.response.headers["x-should-retry"] == "false"
    an = anthropic.Anthropic(base_url=rig.url, api_key=rig.token, max_retries=2)
    with pytest.raises(anthropic.APIStatusError):
        an.messages.create(model="slow", max_tokens=100, messages=[{"role": "user", "content": "x"}])
    assert upstream.hits["up-drop"] == 1 and upstream.hits["up-slow"] == 1
    assert _states(rig) == Counter({"unknown": 2})
    assert upstream.bad_auth == 0


def test_mid_stream_drop_is_unknown(rig: Rig) -> None:
    oa = openai.OpenAI(base_url=f"{rig.url}/v1", api_key=rig.token, max_retries=2)
    seen = []
    with pytest.raises(openai.APIError):
        for chunk in oa.chat.completions.create(model="drop", max_tokens=100, stream=True,
                                                messages=[{"role": "user", "content": "x"}]):
            seen.extend(c.delta.content or "" for c in chunk.choices)
    assert "".join(seen) == "a b "
    assert _states(rig) == Counter({"unknown": 1})
    list(oa.chat.completions.create(model="ok", max_tokens=100, stream=True,
                                    messages=[{"role": "user", "content": "x"}]))
    assert _states(rig) == Counter({"unknown": 1, "settled": 1})


def test_upstream_errors_release_and_may_be_retried(rig: Rig, upstream: Upstream) -> None:
    oa = openai.OpenAI(base_url=f"{rig.url}/v1", api_key=rig.token, max_retries=1)
    for model in ("500", "429"):
        with pytest.raises(openai.APIStatusError) as caught:
            oa.chat.completions.create(model=model, max_tokens=100, messages=[{"role": "user", "content": "x"}])
        assert caught.value.response.headers["x-should-retry"] == "true"
    assert upstream.hits["up-500"] == 2 and upstream.hits["up-429"] == 2
    assert _states(rig) == Counter({"released": 4})
    goal = rig.store.get_goal(rig.goal_id)
    assert goal.envelope.reserved == 0 and goal.envelope.settled == 0


def test_fifty_concurrent_calls_never_pass_the_ceiling_and_reconcile_is_exact(
        rig: Rig, upstream: Upstream, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    models = ["ok", "drop", "slow", "500", "429"]
    bodies: list[bytes] = []

    async def one(client: httpx.AsyncClient, n: int) -> tuple[str, int, str]:
        model = models[n % len(models)]
        response = await client.post("/v1/chat/completions", json={
            "model": model, "max_tokens": 1000, "stream": n % 2 == 0,
            "messages": [{"role": "user", "content": f"request {n}"}]})
        body = await response.aread()
        bodies.append(body + str(dict(response.headers)).encode())
        return model, response.status_code, body.decode()

    async def main() -> list[tuple[str, int, str]]:
        async with httpx.AsyncClient(base_url=rig.url, timeout=30,
                                     headers={"authorization": f"Bearer {rig.token}"}) as client:
            return await asyncio.gather(*(one(client, n) for n in range(50)))

    results = asyncio.run(main())
    assert rig.broker.wait_settled(10)
    goal = rig.store.get_goal(rig.goal_id)
    reservations = rig.store.list_reservations(rig.goal_id)
    settled = sum(r.actual or 0 for r in reservations if r.state is ReservationState.SETTLED)
    unknown = [r for r in reservations if r.state is ReservationState.UNKNOWN]
    # the ceiling holds: everything settled plus everything still held fits in the budget
    assert goal.envelope.settled + goal.envelope.reserved <= goal.budget_micro_usd
    assert goal.envelope.settled == settled
    assert goal.envelope.reserved == sum(r.amount for r in unknown)
    assert any(status == 402 for _, status, _ in results)  # the budget ran out for some
    # every drop or timeout after send is unknown, and was answered as such
    lost = [body for model, status, body in results if model in ("drop", "slow") and status != 402]
    assert len(unknown) == len(lost)
    assert all("upstream_unknown" in body for body in lost)
    assert upstream.bad_auth == 0
    # reconcile: settle one at a known actual, release the rest; the envelopes come back exactly
    assert unknown, "the mix must include lost answers"
    rig.store.reconcile(unknown[0].id, 7)
    for reservation in unknown[1:]:
        rig.store.reconcile(reservation.id, None)
    goal = rig.store.get_goal(rig.goal_id)
    task = rig.store.get_task(rig.task_id)
    assert goal.envelope.reserved == 0 and task.envelope.reserved == 0
    assert goal.envelope.settled == settled + 7 == task.envelope.settled
    assert goal.envelope.available == goal.budget_micro_usd - settled - 7
    # no provider key anywhere: responses, headers, logs, the store's files
    everything = b"".join(bodies) + caplog.text.encode()
    for path in rig.db.parent.glob("store.db*"):
        everything += path.read_bytes()
    assert UPSTREAM_KEY.encode() not in everything
    assert rig.token.encode() not in caplog.text.encode()
