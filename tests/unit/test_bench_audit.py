"""The audit benchmark's shape (no timing assertions)."""

from __future__ import annotations

from swarmyard.bench import run_area


def test_bench_audit_quick_shape() -> None:
    result = run_area("audit", quick=True, appends=2_000, proof_leaves=4_096, samples=20)
    assert result.area == "audit"
    assert {"appends_per_s", "proof_ms_1m", "proof_tree_size"} <= set(result.summary)
    assert result.summary["proof_tree_size"] == 4_096
    assert result.summary["appends_per_s"] > 0
    names = [row.name for row in result.rows]
    assert names[0] == "appends" and any(name.startswith("inclusion proof") for name in names)
    assert all(row.baseline is not None and row.ratio is not None for row in result.rows)
    assert result.notes  # says the proofs were not measured at 1,000,000 leaves
