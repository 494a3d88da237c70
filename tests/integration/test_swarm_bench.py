"""``swarmyard bench swarm --quick`` runs end to end and reports the keys the issue names (no timing asserted)."""

from __future__ import annotations

import pytest

from swarmyard.bench.swarm import measure, run


@pytest.mark.slow
def test_quick_bench_has_the_summary_keys() -> None:
    result = run(quick=True)
    assert {"workers", "wall_s", "ideal_s", "overhead_ratio"} <= set(result.summary)
    assert result.summary["workers"] == 20 and result.summary["errors"] == 0
    assert result.summary["ideal_s"] == 1.0 and result.summary["overhead_ratio"] > 0
    # where the time went is reported next to the ratio (values are not asserted: they are measurements)
    assert {"server_cpu_ms_per_request_20", "client_cpu_ms_per_request_20"} <= set(result.summary)
    names = [row.name for row in result.rows]
    assert any("last claim answered" in n for n in names) and any("beyond latency" in n for n in names)


@pytest.mark.slow
def test_two_plane_replicas_serve_every_worker() -> None:
    got = measure(10, calls=1, latency_s=0.1, replicas=2)
    assert (got.errors, got.findings) == (0, 10)
    assert got.requests == 10 * 4  # a claim, a model call, a board post and a finding each
    # the server's CPU is counted over both replica processes, not just the one that started them
    assert got.server_cpu_s > 0 and got.client_cpu_s > 0
