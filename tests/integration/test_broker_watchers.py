"""The broker tells its watchers of every call once, over real HTTP: a whole answer is told once its bytes are out
(on the loop's next turn, off the answer's path), and by the time the worker's next request is answered."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conftest import claimed_worker
from swarmyard.broker import BrokerSettings, ModelRoute
from swarmyard.broker.app import Broker
from swarmyard.broker.calls import CallEnd
from swarmyard.broker.providers.scripted import Fail, FailKind, Say, ScriptedProvider
from swarmyard.clock import FakeClock
from swarmyard.plane.app import create_app
from swarmyard.plane.server import BackgroundServer, Listen
from swarmyard.store import SqlStore, open_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    opened = open_store(f"sqlite:///{tmp_path / 'store.db'}", clock=FakeClock())
    yield opened
    opened.close()


def test_each_call_is_told_once_before_the_next_request_is_answered(store: SqlStore) -> None:
    worker = claimed_worker(store, FakeClock(), secret=b"w" * 32, call_cap=20)
    provider = ScriptedProvider({"m-up": [Say("one", input_tokens=10, output_tokens=4),
                                          Say("two", input_tokens=12, output_tokens=5),
                                          Fail(FailKind.STATUS_500)]}, name="script")
    route = ModelRoute("m", "script", upstream_model="m-up", input_per_mtok=1_000_000, output_per_mtok=2_000_000)
    broker = Broker(store, worker.tokens, {"script": provider}, BrokerSettings(routes=(route,)))
    told: list[CallEnd] = []
    broker.watchers.append(told.append)
    app = create_app(store, worker.tokens, extra_routes=broker.routes())
    me = {"authorization": f"Bearer {worker.token}"}
    body = {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}

    with BackgroundServer(app, Listen(None, "127.0.0.1", 0)) as server, \
            httpx.Client(base_url=f"http://127.0.0.1:{server.tcp_port}", headers=me, timeout=30) as http:
        first = http.post("/v1/chat/completions", json=body)
        assert first.status_code == 200 and first.json()["choices"][0]["message"]["content"] == "one"
        assert http.get("/v1/models").status_code == 200  # the next request: the call was told before it
        assert [c.outcome for c in told] == ["settled"]
        assert http.post("/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": "again"}]}
                         ).status_code == 200
        assert http.post("/v1/chat/completions", json={**body, "model": "nope"}).status_code == 404
        assert http.post("/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": "3"}]}
                         ).status_code == 502
        assert broker.wait_settled(10)
    assert [(c.outcome, c.error_code) for c in told] == [
        ("settled", None), ("settled", None), ("refused", "not_found"), ("released", told[3].error_code)]
    settled = {r.id: r for r in store.list_reservations(worker.goal_id)}
    for call, (text, tokens) in zip(told[:2], (("one", (10, 4)), ("two", (12, 5))), strict=True):
        assert (call.output_text, (call.input_tokens, call.output_tokens)) == (text, tokens)
        assert call.cost_micro_usd == settled[call.reservation_id].actual == tokens[0] + 2 * tokens[1]
        assert call.ended_s >= call.started_s and call.provider_kind == "swarmyard.scripted"
    assert len({c.reservation_id for c in told[:2]}) == 2 and told[3].error_code
