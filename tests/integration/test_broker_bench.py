"""The broker benchmark runs and reports the keys the issue names (no timing assertions)."""

from __future__ import annotations

import pytest

from swarmyard.bench.broker import run


@pytest.mark.slow
def test_quick_bench_has_the_summary_keys() -> None:
    result = run(quick=True)
    for key in ("overhead_ms_p50", "overhead_ms_p99", "stream_overhead_ms_p50", "concurrent_streams"):
        assert key in result.summary
    assert result.summary["concurrent_errors"] == 0
    assert all(row.baseline is not None for row in result.rows if "via broker" in row.name)
