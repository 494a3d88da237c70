"""OpenTelemetry traces of a run, exported over OTLP (HTTP/protobuf) with the OpenTelemetry SDK (the ``otel`` extra).

One trace per run: the run's span; a span per task under it; a span per agent run under the task it held (under
the run when it held none); a span per agent step under its agent run (from the trajectory the agent reported);
a span per model call under the step it was made in.

Model calls are sent while the run goes (``LiveTrace``): the broker tells of each call as it ends, its span
goes to the SDK's ``BatchSpanProcessor``, which sends batches in the background; the OTLP exporter retries a
collector that refuses or cannot be reached (with backoff, for ``RETRY_S``), and a batch it still could not send
is written to ``traces.otlp.jsonl`` in the run folder (OTLP/JSON, one ``ExportTraceServiceRequest`` a line, as
the collector's ``otlpjsonfile`` receiver reads it). The run, task, agent and step spans are built from what the
run recorded and go through the same processor when it ends.

A model call's span follows the GenAI semantic conventions: ``gen_ai.operation.name`` (``chat``),
``gen_ai.provider.name``, ``gen_ai.request.model``, ``gen_ai.request.max_tokens``, ``gen_ai.response.model``,
``gen_ai.response.id``, ``gen_ai.response.finish_reasons``, ``gen_ai.usage.input_tokens`` and
``gen_ai.usage.output_tokens``, ``error.type`` when it failed. Its cost is ``gen_ai.usage.cost`` in USD (no
convention names a cost; this is the name Langfuse reads into a generation's cost) and exactly, in integer
micro-USD as the ledger settles it, ``swarmyard.spend_micro_usd``. Message content is sent only when asked for
(``--otlp-content`` or ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``): the conventions' opt-in
attributes ``gen_ai.system_instructions``, ``gen_ai.input.messages`` and ``gen_ai.output.messages``. Every span
carries swarmyard's own (``swarmyard.goal_id``, ``swarmyard.task_id``, ``swarmyard.worker_id``,
``swarmyard.fencing_token``, ``swarmyard.reservation_id``, ``swarmyard.spend_micro_usd``).

Span ids come from the ids they stand for (a SHA-256 of the goal, task, worker or reservation id), so the tree is
the same whichever process writes a part of it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarmyard.errors import UserError
from swarmyard.plane.trajectory import read_trajectory, without_tokens

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from swarmyard.broker.calls import CallEnd
    from swarmyard.report.data import ReportData

log = logging.getLogger(__name__)

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
#: the variable the OpenTelemetry GenAI instrumentations read to send message content
CONTENT_VAR = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
#: how long the exporter retries one batch (backoff between tries) before it goes to the file
RETRY_S = 10.0
#: after a batch went to the file, later ones go there too for this long without trying the collector
COOL_OFF_S = 30.0
#: beyond the exporter's own retries, how long one batch may take before it goes to the file: the exporter's
#: timeout is per read, so a collector that sends its answer a byte a second would hold the batch for ever
GRACE_S = 2.0
#: the file batches the collector did not take are written to, in the run folder
FALLBACK_FILE = "traces.otlp.jsonl"
#: characters of one message part's content sent as a span attribute
MAX_PART_CHARS = 16_000
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


def _nodes(data: ReportData, steps: Mapping[str, Sequence[dict[str, Any]]], *, calls: bool = True,
           made_steps: Mapping[int, tuple[str, int, float, float]] | None = None) -> list[_Node]:
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
    reported = {n.span_id for n in nodes}
    for step_id, (worker, number, start, end) in (made_steps or {}).items():
        if step_id not in reported and worker in agents:  # a step its agent never reported (it died in it)
            nodes.append(_Node(f"swarmyard.agent.step {number}", step_id, _id(64, "agent", worker), start,
                               max(start, end), {"swarmyard.goal_id": goal.id, "swarmyard.worker_id": worker,
                                                 "swarmyard.step": number, "swarmyard.step_reported": False}))
    for r in data.reservations if calls else ():
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


def _sdk_span(node: _Node, trace_id: int) -> ReadableSpan:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

    from swarmyard import __version__

    resource = Resource.create({"service.name": "swarmyard", "service.version": __version__})
    scope = InstrumentationScope("swarmyard", __version__)
    flags = TraceFlags(TraceFlags.SAMPLED)
    parent = None if node.parent_id is None else SpanContext(trace_id, node.parent_id, False, flags)
    status = Status(StatusCode.ERROR, without_tokens(node.error[:500])) if node.error else Status(StatusCode.OK)
    # no capability token in a span: an agent may have printed its own into what it sent its model
    attributes = {k: without_tokens(v) if isinstance(v, str) else
                  [without_tokens(x) if isinstance(x, str) else x for x in v] if isinstance(v, (list, tuple)) else v
                  for k, v in node.attributes.items()}
    return ReadableSpan(
        without_tokens(node.name), context=SpanContext(trace_id, node.span_id, False, flags), parent=parent,
        resource=resource, attributes=attributes, kind=SpanKind.CLIENT if node.client else SpanKind.INTERNAL,
        status=status, start_time=_ns(node.start_s), end_time=_ns(node.end_s), instrumentation_scope=scope)


def run_spans(data: ReportData, agents_dir: Path, *, calls: bool = True,
              made_steps: Mapping[int, tuple[str, int, float, float]] | None = None) -> list[ReadableSpan]:
    """The run's spans as OpenTelemetry SDK spans (the trajectories are read from ``agents_dir``); without
    ``calls`` the model calls' (sent as they ended) are left out; ``made_steps`` are the steps those calls were
    made in, a span each for those the agent never reported."""
    steps: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(agents_dir.glob("*.jsonl")) if agents_dir.is_dir() else ():
        if path.name.endswith(".transcript.jsonl"):
            continue
        for step in read_trajectory(path):
            worker = step.get("worker")
            if isinstance(worker, str):
                steps.setdefault(worker, []).append(step)
    trace_id = _id(128, "trace", data.goal.id)
    return [_sdk_span(node, trace_id) for node in _nodes(data, steps, calls=calls, made_steps=made_steps)]


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


def content_wanted(flag: bool, env: Mapping[str, str]) -> bool:
    """Whether message content goes into the spans: ``--otlp-content``, or the GenAI instrumentations' variable
    set to ``SPAN_ONLY``, ``SPAN_AND_EVENT`` or ``true`` (``NO_CONTENT``, unset or anything else: no content)."""
    return flag or env.get(CONTENT_VAR, "").strip().upper() in ("SPAN_ONLY", "SPAN_AND_EVENT", "TRUE", "1")


def _cut(text: str) -> str:
    return text if len(text) <= MAX_PART_CHARS else text[:MAX_PART_CHARS] + f"... [{len(text)} characters, cut]"


def _parts(content: str, tool_calls: Sequence[Any], tool_call_id: str | None = None) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    if content:
        parts.append({"type": "tool_call_response", "id": tool_call_id, "response": _cut(content)}
                     if tool_call_id is not None else {"type": "text", "content": _cut(content)})
    parts += [{"type": "tool_call", "id": c.id, "name": c.name, "arguments": _cut(c.arguments)} for c in tool_calls]
    return parts


def call_attributes(call: CallEnd, *, content: bool) -> dict[str, Any]:
    """A model call's span attributes (GenAI semantic conventions, then swarmyard's); content only if asked."""
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": call.provider_kind or "swarmyard",
        "gen_ai.request.model": call.model,
        "gen_ai.usage.input_tokens": call.input_tokens, "gen_ai.usage.output_tokens": call.output_tokens,
        "gen_ai.usage.cost": call.cost_micro_usd / 1_000_000,
        "swarmyard.goal_id": call.goal_id, "swarmyard.task_id": call.task_id,
        "swarmyard.worker_id": call.worker_id,
        "swarmyard.reservation_id": call.reservation_id, "swarmyard.reservation_state": call.outcome,
        "swarmyard.hold_micro_usd": call.hold_micro_usd, "swarmyard.spend_micro_usd": call.cost_micro_usd,
        "swarmyard.provider": call.provider, "swarmyard.upstream_model": call.upstream_model,
    }
    if call.max_tokens:
        attrs["gen_ai.request.max_tokens"] = call.max_tokens
    if call.stream:
        attrs["gen_ai.request.stream"] = True
    if call.response_model or call.outcome == "settled":
        # an answer that names no model came from the one asked for (the upstream's name for it)
        attrs["gen_ai.response.model"] = call.response_model or call.upstream_model or call.model
    if call.response_id:
        attrs["gen_ai.response.id"] = call.response_id
    if call.finish_reason:
        attrs["gen_ai.response.finish_reasons"] = (call.finish_reason,)
    if call.error_code:
        attrs["error.type"] = call.error_code
    if content:
        system = [m for m in call.messages if m.role.value == "system"]
        if system:
            attrs["gen_ai.system_instructions"] = json.dumps(
                [{"type": "text", "content": _cut(m.content)} for m in system], ensure_ascii=False)
        attrs["gen_ai.input.messages"] = json.dumps(
            [{"role": m.role.value, "parts": _parts(m.content, m.tool_calls, m.tool_call_id)}
             for m in call.messages if m.role.value != "system"], ensure_ascii=False)
        if call.outcome == "settled":
            attrs["gen_ai.output.messages"] = json.dumps(
                [{"role": "assistant", "parts": _parts(call.output_text, call.output_tool_calls),
                  "finish_reason": call.finish_reason or "stop"}], ensure_ascii=False)
    return attrs


def otlp_json_lines(spans: Sequence[ReadableSpan]) -> bytes:
    """``spans`` as one OTLP/JSON ``ExportTraceServiceRequest`` line (ids in hex, as OTLP/JSON has them)."""
    import base64

    from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    body = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for resource in body.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def _headers_only() -> Any:
    """A requests session that reads a collector's status and headers and never its body (nothing in it is
    used): a collector answering with an endless body would otherwise be read into memory whole."""
    import requests

    class HeadersOnly(requests.Session):
        def request(self, *args: Any, **kwargs: Any) -> requests.Response:
            kwargs["stream"] = True
            response = super().request(*args, **kwargs)
            response.close()
            return response

    return HeadersOnly()


class FallbackExporter:
    """The OTLP/HTTP exporter (which retries with backoff for ``RETRY_S``), and, for a batch it could not send,
    the fallback file; after a failure the collector is left alone for ``COOL_OFF_S`` (batches go to the file),
    so a run whose collector is down is not slowed by ten seconds a batch."""

    def __init__(self, url: str, fallback: Path, *, retry_s: float = RETRY_S, cool_off_s: float = COOL_OFF_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        self.url = url
        self.fallback = fallback
        self._otlp: SpanExporter = OTLPSpanExporter(endpoint=url, timeout=retry_s, session=_headers_only())
        self._deadline_s = retry_s + GRACE_S
        #: an export that outlived its deadline, still reading: no other is started while it lives
        self._stuck: threading.Thread | None = None
        self._cool_off_s = cool_off_s
        self._clock = clock
        self._down_until = -1.0
        self._lock = threading.Lock()
        self.sent = 0
        self.filed = 0
        self.lost = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        from opentelemetry.sdk.trace.export import SpanExportResult

        if self._clock() >= self._down_until and not (self._stuck is not None and self._stuck.is_alive()):
            if self._send(spans) is SpanExportResult.SUCCESS:
                with self._lock:
                    self.sent += len(spans)
                return SpanExportResult.SUCCESS
            self._down_until = self._clock() + self._cool_off_s
        try:
            line = otlp_json_lines(spans)
            with self._lock:
                fd = os.open(self.fallback, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, line)
                finally:
                    os.close(fd)
                self.filed += len(spans)
        except OSError as exc:
            log.warning("%d spans were neither sent to %s nor written to %s: %s", len(spans), self.url,
                        self.fallback, exc)
            with self._lock:
                self.lost += len(spans)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def _send(self, spans: Sequence[ReadableSpan]) -> SpanExportResult | None:
        """The exporter's answer for ``spans``, or ``None`` when it has none within the deadline (the thread that
        asked is left to end by itself; the batch goes to the file)."""
        answer: list[SpanExportResult] = []
        thread = threading.Thread(target=lambda: answer.append(self._otlp.export(spans)), daemon=True,
                                  name="swarmyard-otlp-export")
        thread.start()
        thread.join(self._deadline_s)
        if thread.is_alive():
            self._stuck = thread
            return None
        return answer[0] if answer else None

    def shutdown(self) -> None:
        if self._stuck is not None and self._stuck.is_alive():
            return  # its session is in use by the export still reading: closing it under that read helps nothing
        self._otlp.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class LiveTrace:
    """The run's trace as it goes: a span for each model call as the broker tells of its end (``model_call``, a
    ``CallEnd`` watcher), batched and sent in the background; the run's tree at its end (``finish``)."""

    def __init__(self, url: str, *, content: bool = False, retry_s: float = RETRY_S,
                 cool_off_s: float = COOL_OFF_S) -> None:
        self.url = url
        self.content = content
        self._retry_s = retry_s
        self._cool_off_s = cool_off_s
        self._processor: Any = None
        self.exporter: FallbackExporter | None = None
        self._trace_id = 0
        self._step_of: Callable[[str], int] = lambda worker: 0
        #: step span id -> (worker, step, first call's start, last call's end): the steps calls were made in
        self.made_steps: dict[int, tuple[str, int, float, float]] = {}
        self.calls = 0

    @property
    def fallback(self) -> Path | None:
        """The file batches the collector did not take go to (``None`` before ``begin``)."""
        return self.exporter.fallback if self.exporter is not None else None

    def begin(self, run_dir: Path, goal_id: str, *, step_of: Callable[[str], int] | None = None) -> None:
        """Start the batch processor for the run of ``goal_id`` (its fallback file in ``run_dir``); ``step_of``
        says which step a worker is in (its last reported one plus one)."""
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        # the exporter's own warnings and errors would say, per batch, what the fallback file makes good: the run
        # says it once at its end (and a batch neither sent nor written is logged by FallbackExporter)
        logging.getLogger("opentelemetry.exporter.otlp").setLevel(logging.CRITICAL)
        self.exporter = FallbackExporter(self.url, run_dir / FALLBACK_FILE, retry_s=self._retry_s,
                                         cool_off_s=self._cool_off_s)
        self._processor = BatchSpanProcessor(self.exporter, schedule_delay_millis=2000, max_queue_size=8192,  # type: ignore[arg-type]
                                             export_timeout_millis=int((self._retry_s + 5) * 1000))
        self._trace_id = _id(128, "trace", goal_id)
        if step_of is not None:
            self._step_of = step_of

    def model_call(self, call: CallEnd) -> None:
        """One model call's span, queued for the next batch (called on the broker's event loop: no I/O)."""
        if self._processor is None or not call.reservation_id:
            return  # refused before admission: counted in /metrics, no span
        step = self._step_of(call.worker_id) + 1
        step_id = _id(64, "step", call.worker_id, str(step))
        known = self.made_steps.get(step_id)
        self.made_steps[step_id] = (call.worker_id, step, known[2] if known else call.started_s, call.ended_s)
        error = f"{call.error_code}: {call.error_message}" if call.error_code else ""
        node = _Node(f"chat {call.model}", _id(64, "call", call.reservation_id), step_id, call.started_s,
                     max(call.started_s, call.ended_s), call_attributes(call, content=self.content), client=True,
                     error=error)
        self._processor.on_end(_sdk_span(node, self._trace_id))
        self.calls += 1

    def finish(self, data: ReportData | None, agents_dir: Path) -> tuple[int, int, int]:
        """Queue the run's tree (without the calls, sent already), send what is left, stop; (sent, written to
        the fallback file, lost) spans."""
        if self._processor is None or self.exporter is None:
            return 0, 0, 0
        if data is not None:
            for span in run_spans(data, agents_dir, calls=False, made_steps=self.made_steps):
                self._processor.on_end(span)
        self._processor.shutdown()  # flushes: every queued span is exported (or filed) before it returns
        self._processor = None
        return self.exporter.sent, self.exporter.filed, self.exporter.lost
