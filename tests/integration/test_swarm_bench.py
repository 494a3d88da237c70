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


@pytest.mark.slow
def test_two_plane_replicas_serve_every_worker() -> None:
    got = measure(10, calls=1, latency_s=0.1, replicas=2)
    assert (got.errors, got.findings) == (0, 10)
