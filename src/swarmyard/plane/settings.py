"""The control plane's knobs, parsed once at the edge (CLI or coordinator) and passed down."""

from __future__ import annotations

from dataclasses import dataclass

from swarmyard.store.protocol import DEFAULT_ARTIFACT_LIMIT_BYTES, DEFAULT_POST_LIMIT_BYTES


@dataclass(frozen=True, slots=True)
class PlaneSettings:
    """Limits and timings of one control plane.

    ``renew_min_interval_s`` lets a burst of tool calls from one worker share one lease renewal: a call within
    that interval of the last renewal of the same claim does not write again. It is a small fraction of the
    lease, so a worker that keeps calling never loses its lease; ``0`` renews on every call.
    ``store_concurrency`` is the number of threads that run store calls; ``None`` picks by engine: 2 for
    SQLite (one writer at a time: more threads only queue on its write lock, and measured with
    ``swarmyard bench plane`` eight gave about 0.7x the calls/s of two), 8 for PostgreSQL (each statement
    is a round trip that other threads can overlap).
    ``max_body_bytes`` bounds a ``submit_artifact`` body, ``max_request_bytes`` every other request body.
    ``ui_hosts`` are the names, beside the address it listens on, by which a browser may reach the dashboard
    over TCP (``Host: NAME`` or ``NAME:PORT``; see :mod:`swarmyard.plane.dashboard`).
    """

    lease_s: float = 300.0
    renew_min_interval_s: float = 0.0
    max_body_bytes: int = DEFAULT_ARTIFACT_LIMIT_BYTES * 4 // 3 + 4096  # base64 of the largest artifact
    max_request_bytes: int = 1024 * 1024  # every other body: tool calls but submit_artifact, the operator API
    max_post_bytes: int = DEFAULT_POST_LIMIT_BYTES
    rate_per_s: float = 50.0
    rate_burst: int = 100
    store_concurrency: int | None = None
    metrics_public: bool = False
    read_limit_max: int = 500
    ui_hosts: tuple[str, ...] = ()
