"""OpenTelemetry traces of a run, exported over OTLP (HTTP/protobuf) with the OpenTelemetry SDK (the ``otel`` extra).

One trace per run: the run's span; a span per task under it; a span per agent run under the task it held (under
the run when it held none); a span per agent step under its agent run (from the trajectory the agent reported);
a span per model call under the step it was made in (from the call's reservation). Model calls carry the GenAI
semantic conventions (``gen_ai.operation.name``, ``gen_ai.request.model``, ``gen_ai.usage.input_tokens``,
``gen_ai.usage.output_tokens``) and every span swarmyard's own (``swarmyard.goal_id``, ``swarmyard.task_id``,
``swarmyard.worker_id``, ``swarmyard.fencing_token``, ``swarmyard.reservation_id``,
``swarmyard.spend_micro_usd``).

Span ids come from the ids they stand for (a SHA-256 of the goal, task or worker id), so the tree is the same
whichever process writes a part of it. The spans are built from what the run recorded and sent when it ends.
"""

from __future__ import annotations

import hashlib
import logging
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarmyard.errors import UserError
from swarmyard.plane.trajectory import read_trajectory

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

    from swarmyard.report.data import ReportData

log = logging.getLogger(__name__)

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_HINT = "OpenTelemetry export needs the otel extra: pip install 'swarmyard[otel]'"


def otlp_url(flag: str | None, env: Mapping[str, str]) -> str | None:
    """Where to send traces: ``--otlp URL``, else the standard variables; ``None`` when neither is set.

    A base URL gets ``/v1/traces`` (as ``OTEL_EXPORTER_OTLP_ENDPOINT`` means); the traces variable is taken as
    it is. Checked before anything starts: a URL that is not http(s), or a missing extra, is a ``UserError``.
    """
    url, full = flag, False
    if url is None:
        for name in ENDPOINT_VARS:
            if env.get(name):
                url, full = env[name], name == ENDPOINT_VARS[0]
                break
    if url is None:
        return None
    _check_url(url)
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        raise UserError(_HINT) from exc
    if full or url.rstrip("/").endswith("/v1/traces"):
        return url
    return url.rstrip("/") + "/v1/traces"


def _check_url(url: str) -> None:
    """Refuse, before the run, a URL the exporter could only fail on after it: parsed whole (host, port), as
    ``http://[::1`` passes a look at its scheme."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises for a port that is not a number from 0 to 65535
    except ValueError as exc:
        raise UserError(f"OTLP endpoint {url!r} is not a URL: {exc}") from exc
    if parts.scheme not in ("http", "https") or not url.startswith(f"{parts.scheme}://"):
        raise UserError(f"OTLP endpoint {url!r}: give an http:// or https:// URL (OTLP over HTTP/protobuf)")
    if not parts.hostname or any(c.isspace() or not c.isprintable() for c in url):
        raise UserError(f"OTLP endpoint {url!r}: the http(s) URL needs a host (and no spaces)")
    if port == 0:
        raise UserError(f"OTLP endpoint {url!r}: port 0 is no port to send to")


def _id(bits: int, *parts: str) -> int:
    digest = hashlib.sha256("\x00".join(parts).encode()).digest()
    return int.from_bytes(digest[: bits // 8], "big") or 1


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


@dataclass(frozen=True, slots=True)
class _Node:
    name: str
    span_id: int
    parent_id: int | None
    start_s: float
    end_s: float
    attributes: dict[str, Any]
    client: bool = False
    error: str = ""


def _nodes(data: ReportData, steps: Mapping[str, Sequence[dict[str, Any]]]) -> list[_Node]:
    goal = data.goal
    run_end = goal.created_at + data.wall_s
    run_id = _id(64, "run", goal.id)
    nodes = [_Node(f"swarmyard.run {data.run_id}", run_id, None, goal.created_at, max(goal.created_at, run_end), {
        "swarmyard.run_id": data.run_id, "swarmyard.goal_id": goal.id, "swarmyard.policy": goal.policy,
        "swarmyard.budget_micro_usd": goal.budget_micro_usd, "swarmyard.spend_micro_usd": goal.envelope.settled,
        "swarmyard.calls": goal.envelope.calls})]
    ends: dict[str, float] = {}
    for span in data.spans:
        if span.task_id:
            ends[span.task_id] = max(ends.get(span.task_id, 0.0), span.ended_at)
    for task in data.tasks:
        nodes.append(_Node(f"swarmyard.task {task.title}", _id(64, "task", task.id), run_id, task.created_at,
                           max(task.created_at, ends.get(task.id, run_end)), {
            "swarmyard.goal_id": goal.id, "swarmyard.task_id": task.id, "swarmyard.group": task.group,
            "swarmyard.task_state": task.state.value, "swarmyard.fencing_token": task.fencing_token or 0,
            "swarmyard.attempts": task.attempts, "swarmyard.spend_micro_usd": task.envelope.settled},
            error=task.result or "" if task.state.value == "failed" else ""))
    known_tasks = {t.id for t in data.tasks}
    windows: dict[str, list[tuple[float, float, int, int | None]]] = {}
    for span in data.spans:
        agent_id = _id(64, "agent", span.worker_id)
        parent = _id(64, "task", span.task_id) if span.task_id in known_tasks and span.task_id else run_id
        nodes.append(_Node(f"swarmyard.agent {span.slot or span.row}", agent_id, parent, span.started_at,
                           max(span.started_at, span.ended_at), {
            "swarmyard.goal_id": goal.id, "swarmyard.worker_id": span.worker_id,
            "swarmyard.task_id": span.task_id or "", "swarmyard.slot": span.slot or span.row,
            "swarmyard.ending": span.ending, "swarmyard.steps": span.steps,
            "swarmyard.exit_code": -1 if span.exit_code is None else span.exit_code},
            error=span.error if span.ending in ("error", "timeout") else ""))
        for step in steps.get(span.worker_id, ()):
            if step.get("cut") or not isinstance(step.get("step"), int):
                continue
            step_id = _id(64, "step", span.worker_id, str(step["step"]))
            start, end = step.get("started_ms", 0) / 1000, step.get("ended_ms", 0) / 1000
            replies = [r for r in step.get("replies", []) if isinstance(r, dict)]
            action = step.get("action") if isinstance(step.get("action"), dict) else None
            token = step.get("fencing_token")
            windows.setdefault(span.worker_id, []).append((start, end, step_id, token))
            nodes.append(_Node(f"swarmyard.agent.step {step['step']}", step_id, agent_id, start, max(start, end), {
                "swarmyard.goal_id": goal.id, "swarmyard.worker_id": span.worker_id,
                "swarmyard.task_id": str(step.get("task_id") or ""), "swarmyard.fencing_token": token or 0,
                "swarmyard.step": step["step"], "swarmyard.action": str(action.get("tool")) if action else "",
                "swarmyard.model_replies": len(replies),
                "swarmyard.malformed_replies": sum(1 for r in replies if r.get("malformed")),
                "gen_ai.usage.input_tokens": sum(int(r.get("input_tokens", 0)) for r in replies),
                "gen_ai.usage.output_tokens": sum(int(r.get("output_tokens", 0)) for r in replies)}))
    agents = {s.worker_id for s in data.spans}
    for r in data.reservations:
        worker = r.worker_id or ""
        parent, token = run_id, None
        if worker in agents:
            parent = _id(64, "agent", worker)
            for start, end, step_id, step_token in windows.get(worker, ()):
                if start <= r.created_at <= end:
                    parent, token = step_id, step_token
                    break
        spend = r.actual if r.actual is not None else 0
        nodes.append(_Node(f"chat {r.model}", _id(64, "call", r.id), parent, r.created_at,
                           max(r.created_at, r.updated_at), {
            "gen_ai.operation.name": "chat", "gen_ai.request.model": r.model,
            "gen_ai.usage.input_tokens": r.input_tokens, "gen_ai.usage.output_tokens": r.output_tokens,
            "swarmyard.goal_id": goal.id, "swarmyard.task_id": r.task_id, "swarmyard.worker_id": worker,
            "swarmyard.fencing_token": token or 0, "swarmyard.reservation_id": r.id,
            "swarmyard.reservation_state": r.state.value, "swarmyard.hold_micro_usd": r.amount,
            "swarmyard.spend_micro_usd": spend}, client=True,
            error=f"reservation {r.state.value}" if r.state.value in ("unknown", "released") else ""))
    return nodes


def run_spans(data: ReportData, agents_dir: Path) -> list[ReadableSpan]:
    """The run's spans as OpenTelemetry SDK spans (the trajectories are read from ``agents_dir``)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

    from swarmyard import __version__

    steps: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(agents_dir.glob("*.jsonl")) if agents_dir.is_dir() else ():
        if path.name.endswith(".transcript.jsonl"):
            continue
        for step in read_trajectory(path):
            worker = step.get("worker")
            if isinstance(worker, str):
                steps.setdefault(worker, []).append(step)
    trace_id = _id(128, "trace", data.goal.id)
    resource = Resource.create({"service.name": "swarmyard", "service.version": __version__})
    scope = InstrumentationScope("swarmyard", __version__)
    flags = TraceFlags(TraceFlags.SAMPLED)
    out = []
    for node in _nodes(data, steps):
        parent = None if node.parent_id is None else SpanContext(trace_id, node.parent_id, False, flags)
        status = Status(StatusCode.ERROR, node.error[:500]) if node.error else Status(StatusCode.OK)
        out.append(ReadableSpan(
            node.name, context=SpanContext(trace_id, node.span_id, False, flags), parent=parent, resource=resource,
            attributes=node.attributes, kind=SpanKind.CLIENT if node.client else SpanKind.INTERNAL,
            status=status, start_time=_ns(node.start_s), end_time=_ns(node.end_s), instrumentation_scope=scope))
    return out


def export_run(url: str, data: ReportData, agents_dir: Path, *, timeout_s: float = 30.0) -> int:
    """Send the run's trace to ``url``; the number of spans sent. A refusal or an unreachable collector is a
    ``UserError`` naming the URL (the run itself is over and written)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    spans = run_spans(data, agents_dir)
    exporter = OTLPSpanExporter(endpoint=url, timeout=timeout_s)
    try:
        result = exporter.export(spans)
    finally:
        exporter.shutdown()  # type: ignore[no-untyped-call]
    if result is not SpanExportResult.SUCCESS:
        raise UserError(f"the OTLP collector at {url} did not take the run's {len(spans)} spans (see the log)")
    return len(spans)
