"""The broker benchmark runs and reports the keys the issue names (no timing assertions)."""

from __future__ import annotations

import pytest

from swarmyard.bench.broker import run


@pytest.mark.slow
def test_quick_bench_has_the_summary_keys() -> None:
    result = run(quick=True)
    for key in ("overhead_ms_p50", "overhead_ms_p99", "stream_overhead_ms_p50", "concurrent_streams",
                "bare_proxy_overhead_ms_p50"):
        assert key in result.summary
    assert result.summary["concurrent_errors"] == 0
    assert all(row.baseline is not None for row in result.rows if "via broker" in row.name)
    # the bare proxy is measured beside the broker (each of its calls checked the upstream's answer came back)
    assert len([row for row in result.rows if "bare forwarding proxy" in row.name]) == 4
