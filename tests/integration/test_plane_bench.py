"""``swarmyard bench plane --quick`` has the shape the CLI prints (no timing assertions)."""

from __future__ import annotations

import pytest

from swarmyard.bench.plane import run


@pytest.mark.slow
def test_quick_bench_shape() -> None:
    result = run(quick=True)
    assert {"calls_per_s", "p99_ms", "duplicates"} <= set(result.summary)
    assert result.summary["duplicates"] == 0 and result.summary["errors"] == 0
    assert result.summary["calls_per_s"] > 0
    assert all(row.baseline is not None for row in result.rows)
    # one serving process and two (swarmyard serve --workers 2), each against an echo served the same way
    assert set(result.summary["by_server_processes"]) == {"1", "2"}
    assert result.summary["server_processes"] in (1, 2)
    assert all(v["duplicates"] == 0 and v["errors"] == 0
               for per in result.summary["by_server_processes"].values() for v in per.values())
