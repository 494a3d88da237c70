"""Prometheus metrics of one control plane, in a registry of its own (two apps in a process never clash).

Counters and the latency histogram are updated on every call; the gauges that describe the run (live claims,
workers, spend) are read from the store at scrape time, so they are right even with several replicas.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from swarmyard.domain import TaskState
from swarmyard.store.protocol import Store

if TYPE_CHECKING:
    from swarmyard.broker.app import Broker
    from swarmyard.broker.calls import CallEnd

#: Tool latencies sit between a fraction of a millisecond and a slow PostgreSQL round trip.
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: Model calls: a scripted answer in a millisecond, a hosted model's in seconds, a local model on a small host's
#: in minutes (the conventions' gen_ai.client.operation.duration buckets, stretched to ten minutes).
_CALL_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
                 81.92, 163.84, 327.68, 655.36)


class _StoreCollector(Collector):
    """Gauges computed from the store at scrape time."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def collect(self) -> Iterator[GaugeMetricFamily]:
        claims = GaugeMetricFamily("swarmyard_live_claims", "Tasks currently claimed", labels=["goal"])
        workers = GaugeMetricFamily("swarmyard_workers", "Workers with an unrevoked token", labels=["goal"])
        spend = GaugeMetricFamily("swarmyard_spend_micro_usd", "Settled spend", labels=["goal"])
        reserved = GaugeMetricFamily("swarmyard_reserved_micro_usd", "Spend held by open reservations",
                                     labels=["goal"])
        for goal in self._store.list_goals():
            claims.add_metric([goal.id], len(self._store.list_tasks(goal.id, state=TaskState.CLAIMED)))
            workers.add_metric([goal.id], sum(1 for w in self._store.list_workers(goal.id) if not w.revoked))
            spend.add_metric([goal.id], goal.envelope.settled)
            reserved.add_metric([goal.id], goal.envelope.reserved)
        yield from (claims, workers, spend, reserved)


class _WakesCollector(Collector):
    """The dashboard's count of wakes, read at scrape time."""

    def __init__(self, wakes: Callable[[], int]) -> None:
        self._wakes = wakes

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily("swarmyard_dashboard_wakes", "Times the plane woke the dashboard's streams to "
                                  "rebuild a goal's state", value=self._wakes())


class PlaneMetrics:
    """The control plane's metrics and their exposition."""

    def __init__(self, store: Store) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.tool_calls = Counter("swarmyard_tool_calls", "Worker tool calls by tool and HTTP status",
                                  ["tool", "status"], registry=self.registry)
        self.tool_latency = Histogram("swarmyard_tool_call_seconds", "Worker tool call latency", ["tool"],
                                      buckets=_BUCKETS, registry=self.registry)
        self.board_posts = Counter("swarmyard_board_posts", "Board posts made through this plane",
                                   registry=self.registry)
        self.operator_calls = Counter("swarmyard_operator_calls", "Operator API calls by HTTP status",
                                      ["status"], registry=self.registry)
        self.model_latency = Histogram(
            "swarmyard_model_call_seconds", "Model call latency through the broker, from the request read to the "
            "answer's end, by requested model, provider and outcome (settled, released, unknown)",
            ["model", "provider", "outcome"], buckets=_CALL_BUCKETS, registry=self.registry)
        self.model_errors = Counter(
            "swarmyard_model_call_errors", "Model calls answered with an error, by requested model and error code "
            "(refusals before the call was sent included)", ["model", "code"], registry=self.registry)
        self.registry.register(_StoreCollector(store))
        self._children: dict[tuple[str, int], tuple[Any, Any]] = {}

    def watch_dashboard(self, wakes: Callable[[], int]) -> None:
        """Expose the dashboard's count of wakes (each one a state rebuild for every open stream)."""
        self.registry.register(_WakesCollector(wakes))

    def observe(self, tool: str, status: int, seconds: float) -> None:
        """Count one tool call and its latency."""
        children = self._children.get((tool, status))
        if children is None:
            # labels() validates and hashes the label values under a lock on every call: look them up once.
            children = self._children[(tool, status)] = (self.tool_calls.labels(tool, str(status)),
                                                         self.tool_latency.labels(tool))
        children[0].inc()
        children[1].observe(seconds)

    def watch_broker(self, broker: Broker) -> None:
        """Count the model calls ``broker`` answers (latency of every call sent, errors by code)."""
        broker.watchers.append(self.model_call)

    def model_call(self, call: CallEnd) -> None:
        """One model call's end, as the broker tells it (on the event loop: a few dict lookups)."""
        # a label only for a route's name: a refused request's model may be any text its sender chose
        model = call.model if call.provider else "(no route)"
        if call.outcome != "refused":
            self.model_latency.labels(model, call.provider, call.outcome).observe(call.seconds)
        if call.error_code is not None:
            self.model_errors.labels(model, call.error_code).inc()

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes (reads the store: call it off the event loop)."""
        return generate_latest(self.registry)
