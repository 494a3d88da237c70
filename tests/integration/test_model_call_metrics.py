"""``/metrics`` counts model calls: a latency histogram (``_bucket``/``_sum``/``_count``) by model, provider and
outcome, and errors by code, read with a real GET on the plane's loopback TCP socket and parsed as the
exposition text Prometheus scrapes; the step a worker then reports records each call's model, cost and the
messages it sent."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import claimed_worker
from swarmyard.broker import BrokerSettings, ModelRoute
from swarmyard.broker.app import Broker
from swarmyard.broker.providers.scripted import CallTools, Fail, FailKind, Say, ScriptedProvider
from swarmyard.clock import FakeClock
from swarmyard.plane.app import create_app
from swarmyard.plane.server import BackgroundServer, Listen
from swarmyard.plane.trajectory import TrajectoryFiles
from swarmyard.store import SqlStore, open_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    opened = open_store(f"sqlite:///{tmp_path / 'store.db'}", clock=FakeClock())
    yield opened
    opened.close()


def _families(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    out: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = [(s.name, dict(s.labels), s.value) for s in family.samples]
    return out


def test_metrics_has_model_call_latency_and_errors_by_code(store: SqlStore, tmp_path: Path) -> None:
    worker = claimed_worker(store, FakeClock(), secret=b"q" * 32, call_cap=20)
    provider = ScriptedProvider({"m-2026": [
        Say("first answer", input_tokens=100, output_tokens=50),
        CallTools((("board_post", {"body": "x"}),)),
        Fail(FailKind.STATUS_500), Fail(FailKind.AFTER_SEND)]}, name="script")
    route = ModelRoute("m", "script", upstream_model="m-2026", input_per_mtok=2_000_000, output_per_mtok=8_000_000)
    broker = Broker(store, worker.tokens, {"script": provider}, BrokerSettings(routes=(route,)))
    files = TrajectoryFiles(tmp_path / "agents")
    files.label(worker.worker_id, "worker-0")
    app = create_app(store, worker.tokens, extra_routes=broker.routes(), trajectories=files)
    app.state.plane.metrics.watch_broker(broker)
    broker.watchers.append(files.model_call)
    operator = worker.tokens.issue_operator()
    me = {"authorization": f"Bearer {worker.token}"}
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    second = [*first, {"role": "assistant", "content": "first answer"}, {"role": "user", "content": "again"}]

    with BackgroundServer(app, Listen(None, "127.0.0.1", 0)) as server, \
            httpx.Client(base_url=f"http://127.0.0.1:{server.tcp_port}", timeout=30) as http:
        def chat(messages: list[dict[str, str]], model: str = "m") -> httpx.Response:
            return http.post("/v1/chat/completions", headers=me,
                             json={"model": model, "max_tokens": 100, "messages": messages})

        assert chat(first).status_code == 200
        assert chat(second).status_code == 200
        assert broker.wait_settled(10)
        step = http.post("/v1/trajectory/steps", headers=me, json={"step": 1, "started_ms": 1, "ended_ms": 2})
        assert step.status_code == 200 and step.json() == {"kept": True}
        failed = chat(first)
        lost = chat(second)
        unrouted = chat(first, model="no-such-model")
        assert (failed.status_code, lost.status_code, unrouted.status_code) == (502, 502, 404)
        codes = [r.json()["error"]["code"] for r in (failed, lost, unrouted)]
        assert http.get("/metrics").status_code == 401  # the operator's
        scraped = http.get("/metrics", headers={"authorization": f"Bearer {operator}"})
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
    families = _families(scraped.text)

    samples = families["swarmyard_model_call_seconds"]
    for outcome, calls in (("settled", 2), ("released", 1), ("unknown", 1)):
        labels = {"model": "m", "provider": "script", "outcome": outcome}
        buckets = [(float(s[1]["le"]), s[2]) for s in samples
                   if s[0] == "swarmyard_model_call_seconds_bucket" and {**s[1], "le": ""} == {**labels, "le": ""}]
        assert len(buckets) == 20 and buckets[-1] == (float("inf"), calls), outcome
        assert [c for _, c in buckets] == sorted(c for _, c in buckets)  # cumulative
        [count] = [s[2] for s in samples if s[0] == "swarmyard_model_call_seconds_count" and s[1] == labels]
        [total] = [s[2] for s in samples if s[0] == "swarmyard_model_call_seconds_sum" and s[1] == labels]
        assert count == calls and total >= 0
    errors = {(s[1]["model"], s[1]["code"]): s[2] for s in families["swarmyard_model_call_errors"]
              if s[0] == "swarmyard_model_call_errors_total"}
    assert errors == {("m", codes[0]): 1.0, ("m", codes[1]): 1.0, ("(no route)", codes[2]): 1.0}
    assert codes[1] == "upstream_unknown" and codes[2] == "not_found"

    # the step records its two calls: model, cost as the ledger settled it, and where their messages are
    [line] = [json.loads(x) for x in (tmp_path / "agents" / "worker-0.jsonl").read_text().splitlines()]
    settled = {r.id: r for r in store.list_reservations(worker.goal_id)}
    assert line["model"] == "m" and [c["outcome"] for c in line["calls"]] == ["settled", "settled"]
    assert [c["cost_micro_usd"] for c in line["calls"]] == [settled[c["reservation_id"]].actual
                                                           for c in line["calls"]]
    assert line["calls"][0]["cost_micro_usd"] == 100 * 2 + 50 * 8  # 100 in at $2/Mtok, 50 out at $8/Mtok
    assert line["cost_micro_usd"] == sum(c["cost_micro_usd"] for c in line["calls"]) > 0
    assert line["calls"][1]["finish_reason"] == "tool_calls"
    kept = [json.loads(x) for x in (tmp_path / "agents" / "messages" / "worker-0.jsonl").read_text().splitlines()]
    assert [k["same"] for k in kept[:2]] == [0, 2]  # the second call repeats the first call's two messages
    rebuilt = kept[0]["messages"] + kept[1]["messages"]
    assert [m["parts"][0]["content"] for m in rebuilt] == ["be brief", "hi", "first answer", "again"]
    for call, record, messages in zip(line["calls"], kept, (rebuilt[:2], rebuilt), strict=False):
        assert call["messages"]["file"] == "messages/worker-0.jsonl" and call["messages"]["count"] == len(messages)
        digest = hashlib.sha256(json.dumps(messages, sort_keys=True, separators=(",", ":"),
                                           ensure_ascii=False).encode()).hexdigest()
        assert call["messages"]["sha256"] == record["sha256"] == digest
        assert record["reservation_id"] == call["reservation_id"]
