"""What a run leaves to look at, through the console script on the scripted provider in bwrap machines: one
trajectory line per agent step (with its model calls' model, cost and messages), the OTLP span tree a small
collector on loopback receives (its model calls per the GenAI semantic conventions), or, the collector down,
the run folder's OTLP/JSON fallback file; the report, and ``swarmyard runs list`` / ``runs show``."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from rigs.genai_conventions import off_convention, otlp_json_spans
from rigs.network import free_port, http_server
from rigs.scripted import tool_call as _tool
from rigs.swarm_files import scripted_run

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

SYNTHESIS = "Go: the scout found a market."


class Collector:
    """An OTLP/HTTP trace receiver's record: every ExportTraceServiceRequest it was sent (``handler`` serves it)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.url = ""

    def handler(self) -> type[BaseHTTPRequestHandler]:
        """The receiver's requests: a trace export is kept and answered 200, anything else 404."""
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                if self.path == "/v1/traces" and self.headers["content-type"] == "application/x-protobuf":
                    collector.bodies.append(body)
                    self.send_response(200)
                else:
                    self.send_response(404)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    def spans(self) -> list[dict[str, Any]]:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        out = []
        for body in self.bodies:
            request = ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                service = {a.key: a.value.string_value for a in resource.resource.attributes}["service.name"]
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        attrs = {}
                        for a in span.attributes:
                            kind = a.value.WhichOneof("value")
                            value = getattr(a.value, kind)
                            if kind == "array_value":
                                value = tuple(getattr(v, v.WhichOneof("value")) for v in value.values)
                            attrs[a.key] = value
                        out.append({"name": span.name, "trace": span.trace_id.hex(), "id": span.span_id.hex(),
                                    "parent": span.parent_span_id.hex(), "attrs": attrs, "service": service,
                                    "start": span.start_time_unix_nano, "end": span.end_time_unix_nano})
        return out


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    with http_server(c.handler()) as c.url:
        yield c


def _run(folder: Path, collector_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    swarm = scripted_run(folder, {
        "scripted-worker": [{"say": "not a tool call"}, _tool("board_post", body="the market is large"),
                            _tool("submit_finding", title="market", body="Large and growing.", cite=["1"])],
        "scripted-lead": [_tool("submit_finding", title="synthesis", body=SYNTHESIS)],
    }, workers={"exec_timeout_s": 120, "max_steps": 4}, priced=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8",
           "XDG_STATE_HOME": str(folder / "state"), "OTEL_EXPORTER_OTLP_ENDPOINT": collector_url}
    return subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm), *args],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def run(collector: Collector, short_tmp: Path) -> tuple[Path, subprocess.CompletedProcess[str]]:
    return short_tmp, _run(short_tmp, collector.url)


def _cli(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    return subprocess.run([sys.executable, "-m", "swarmyard.cli", *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_run_leaves_trajectories_a_span_tree_a_report_and_a_runs_listing(
        run: tuple[Path, subprocess.CompletedProcess[str]], collector: Collector) -> None:
    folder, done = run
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == SYNTHESIS
    [run_dir] = (folder / "runs").iterdir()

    # a trajectory per agent, a line per step: the worker's first step holds its malformed reply and the re-ask
    agents = run_dir / "agents"
    [worker_file] = agents.glob("worker-0-*.jsonl")
    [lead_file] = agents.glob("lead-*.jsonl")
    worker_steps = [json.loads(line) for line in worker_file.read_text().splitlines()]
    lead_steps = [json.loads(line) for line in lead_file.read_text().splitlines()]
    assert [s["step"] for s in worker_steps] == [1, 2] and [s["step"] for s in lead_steps] == [1]
    first = worker_steps[0]
    assert [r["text"] for r in first["replies"]] == ["not a tool call", ""]
    assert first["replies"][0]["malformed"] and first["action"] == {"tool": "board_post",
                                                                     "args": {"body": "the market is large"}}
    assert '"seq": 1' in first["result"] and first["fencing_token"] >= 1
    assert all(r["input_tokens"] > 0 for s in worker_steps for r in s["replies"])
    assert worker_steps[1]["action"]["tool"] == "submit_finding" and "fnd_" in worker_steps[1]["result"]
    assert first["ended_ms"] >= first["started_ms"] > 0 and first["cpu_ms"] > 0 and first["max_rss_kb"] > 0
    # each step records its model calls: the model, what each cost (as the ledger settled it), and a digest of
    # the messages sent with where they are kept (what differs from the worker's previous call, a line a call)
    assert [len(s["calls"]) for s in worker_steps] == [2, 1] and len(lead_steps[0]["calls"]) == 1
    assert {s["model"] for s in worker_steps} == {"scripted-worker"} and lead_steps[0]["model"] == "scripted-lead"
    for s in (*worker_steps, *lead_steps):
        assert s["cost_micro_usd"] == sum(c["cost_micro_usd"] for c in s["calls"]) > 0
        assert all(c["outcome"] == "settled" and c["reservation_id"].startswith("rsv_") for c in s["calls"])
    [messages] = (agents / "messages").glob("worker-0-*.jsonl")
    kept = {k["reservation_id"]: k for k in map(json.loads, messages.read_text().splitlines())}
    sent: list[dict[str, Any]] = []
    for c in (c for s in worker_steps for c in s["calls"]):
        record = kept[c["reservation_id"]]
        sent = sent[:record["same"]] + record["messages"]
        assert c["messages"]["file"] == f"messages/{messages.name}" and c["messages"]["count"] == len(sent)
        assert c["messages"]["sha256"] == record["sha256"] == hashlib.sha256(json.dumps(
            sent, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()
    assert sent[0]["role"] == "system" and any("Size the market." in p.get("content", "")
                                               for m in sent for p in m["parts"])
    # the last call kept the system and task messages and sent what followed: the model's reply (its board post)
    # and the tool's result as the next user message
    assert record["same"] == 2 and [m["role"] for m in sent] == ["system", "user", "assistant", "user"]

    # the span tree: run -> tasks -> agent runs -> steps -> model calls, one trace
    assert "spans sent to" in done.stderr
    spans = collector.spans()
    by_id = {s["id"]: s for s in spans}
    assert len(by_id) == len(spans) and len({s["trace"] for s in spans}) == 1
    assert {s["service"] for s in spans} == {"swarmyard"}
    [root] = [s for s in spans if not s["parent"]]
    assert root["name"].startswith("swarmyard.run ") and root["attrs"]["swarmyard.run_id"] == run_dir.name
    assert all(s["parent"] in by_id for s in spans if s is not root)

    def children(span: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
        return sorted((s for s in spans if s["parent"] == span["id"] and s["name"].startswith(prefix)),
                      key=lambda s: s["start"])

    tasks = {s["name"]: s for s in children(root, "swarmyard.task ")}
    assert set(tasks) == {"swarmyard.task market", "swarmyard.task synthesis"}
    [worker] = children(tasks["swarmyard.task market"], "swarmyard.agent ")
    [lead] = children(tasks["swarmyard.task synthesis"], "swarmyard.agent ")
    assert worker["attrs"]["swarmyard.slot"] == "worker-0" and lead["attrs"]["swarmyard.slot"] == "lead"
    steps = children(worker, "swarmyard.agent.step ")
    assert [s["attrs"]["swarmyard.step"] for s in steps] == [1, 2]
    assert [s["attrs"]["swarmyard.action"] for s in steps] == ["board_post", "submit_finding"]
    calls = [children(step, "chat ") for step in steps]
    assert [len(c) for c in calls] == [2, 1]  # the malformed reply and the one re-asked, then the submission
    [lead_step] = children(lead, "swarmyard.agent.step ")
    [lead_call] = children(lead_step, "chat ")
    costs = {c["reservation_id"]: c["cost_micro_usd"] for s in (*worker_steps, *lead_steps) for c in s["calls"]}
    for call in [*calls[0], *calls[1], lead_call]:
        _check_call(call["attrs"], content=False)
        assert costs[call["attrs"]["swarmyard.reservation_id"]] == call["attrs"]["swarmyard.spend_micro_usd"]
    assert [c["attrs"]["gen_ai.response.finish_reasons"] for c in calls[0]] == [("stop",), ("tool_calls",)]
    assert sum(c["attrs"]["swarmyard.spend_micro_usd"] for c in spans if c["name"].startswith("chat ")) == \
        root["attrs"]["swarmyard.spend_micro_usd"]

    # the report: charts, each agent's steps, the board and findings readable, the audit root and key
    md = (run_dir / "report.md").read_text()
    page = (run_dir / "report.html").read_text()
    assert "![Calls, tokens and spend per worker](spend.png)" in md and "## Trajectories" in md
    assert '- step 1 (' in md and '`board_post {"body": "the market is large"}`' in md
    assert "## Audit" in md and f"swarmyard audit verify runs/{run_dir.name} --log-key" in md
    assert '<section id="trajectories">' in page and '<li data-step="2">' in page
    assert '<tr id="post-1">' in page and '<a href="#post-1">post 1</a>' in page
    assert (run_dir / "spend.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # swarmyard runs list / show, from an ordinary folder
    listed = _cli(folder, "runs", "list", "--runs-dir", "runs", "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert row["run"] == run_dir.name and row["status"] == "done" and row["tasks_done"] == 2
    assert row["calls"] == 4 and row["spent_micro_usd"] == root["attrs"]["swarmyard.spend_micro_usd"] > 0
    table = _cli(folder, "runs", "list", "--runs-dir", "runs")
    assert table.returncode == 0 and run_dir.name in table.stdout and "done" in table.stdout
    shown = _cli(folder, "runs", "show", run_dir.name, "--runs-dir", "runs", "--json")
    assert shown.returncode == 0, shown.stderr
    info = json.loads(shown.stdout)
    assert info["synthesis"] == SYNTHESIS and info["audit_root"] and info["audit_size"] > 0
    assert sorted(w["steps"] for w in info["workers"]) == [1, 2]
    assert all(w["trajectory"] and Path(folder, w["trajectory"]).is_file() for w in info["workers"])
    text = _cli(folder, "runs", "show", run_dir.name, "--runs-dir", "runs")
    assert text.returncode == 0 and "synthesis: " + SYNTHESIS in text.stdout
    for bad in (["runs", "show", "nope", "--runs-dir", "runs"], ["runs", "show", "..", "--runs-dir", "runs"],
                ["runs", "list", "--runs-dir", "missing"]):
        refused = _cli(folder, *bad)
        assert refused.returncode == 1 and refused.stderr.startswith("error (user_error):"), bad


def _check_call(a: dict[str, Any], *, content: bool) -> None:
    """A model call's span attributes: the GenAI conventions' names (none unknown, replaced or removed), the
    values the scripted run had, the cost both in USD and exactly; message content only when asked for."""
    assert off_convention(a) == [], off_convention(a)
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "swarmyard.scripted"
    assert a["gen_ai.request.model"] in ("scripted-worker", "scripted-lead")
    assert a["gen_ai.response.model"] == a["gen_ai.request.model"]  # the scripted provider answers as asked
    assert a["gen_ai.response.finish_reasons"][0] in ("stop", "tool_calls") and a["gen_ai.response.id"]
    assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
    assert a["gen_ai.request.max_tokens"] > 0
    assert a["swarmyard.spend_micro_usd"] > 0 and a["gen_ai.usage.cost"] == a["swarmyard.spend_micro_usd"] / 1e6
    assert a["swarmyard.reservation_id"].startswith("rsv_") and a["swarmyard.reservation_state"] == "settled"
    assert a["swarmyard.worker_id"].startswith("wrk_") and a["swarmyard.task_id"].startswith("task_")
    opt_in = {"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions"}
    if not content:
        assert not opt_in & set(a)
        return
    assert opt_in <= set(a)
    inputs, outputs = json.loads(a["gen_ai.input.messages"]), json.loads(a["gen_ai.output.messages"])
    assert json.loads(a["gen_ai.system_instructions"])[0]["type"] == "text"
    assert inputs[0]["role"] == "user" and {p["type"] for m in inputs for p in m["parts"]} <= {
        "text", "tool_call", "tool_call_response"}
    assert outputs[0]["role"] == "assistant" and outputs[0]["finish_reason"] == a["gen_ai.response.finish_reasons"][0]


def test_a_run_whose_collector_is_down_leaves_its_spans_in_the_run_folder(short_tmp: Path) -> None:
    """Nothing listens where the trace goes: the exporter's retries fail, and every span, content included
    (``--otlp-content``), is in the run folder's ``traces.otlp.jsonl``, the same tree the collector would have."""
    folder = short_tmp
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: connections to it are refused
    done = _run(folder, dead, "--otlp-content")
    assert done.returncode == 0, done.stderr[-3000:]
    [run_dir] = (folder / "runs").iterdir()
    fallback = run_dir / "traces.otlp.jsonl"
    [warning] = [line for line in done.stderr.splitlines() if "did not take" in line]
    assert str(fallback) in warning and "lost" not in warning
    spans = otlp_json_spans(fallback)
    by_id = {s["id"]: s for s in spans}
    assert len(by_id) == len(spans) and len({s["trace"] for s in spans}) == 1
    assert {s["service"] for s in spans} == {"swarmyard"}
    [root] = [s for s in spans if not s["parent"]]
    assert root["name"].startswith("swarmyard.run ") and root["attrs"]["swarmyard.run_id"] == run_dir.name
    assert all(s["parent"] in by_id for s in spans if s is not root)
    calls = [s for s in spans if s["name"].startswith("chat ")]
    assert len(calls) == 4 and all(by_id[c["parent"]]["name"].startswith("swarmyard.agent.step ") for c in calls)
    for call in calls:
        _check_call(call["attrs"], content=True)
    assert sum(c["attrs"]["swarmyard.spend_micro_usd"] for c in calls) == root["attrs"]["swarmyard.spend_micro_usd"]
    assert f"did not take {len(spans)} of the run's {len(spans)} spans" in warning
