"""``swarmyard bench wasi --json`` through the console script: every measure is there and each is a measurement
(no timing is asserted: the figures are the benchmark's to report, not the test's to judge)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("wasmtime", reason="WASI tools need the wasi extra (scripts/test installs the dev extra)")
pytestmark = pytest.mark.skipif(shutil.which("clang") is None,
                                reason="needs clang, lld and wasi-libc (scripts/test installs them)")


def test_bench_wasi_reports_call_and_trap_times(wasi_built: Path, tmp_path: Path) -> None:
    # built from source by the session's fixture (tests/conftest.py), which asserts the build exits 0
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SWARMYARD_WASI_DIR": str(wasi_built)}
    done = subprocess.run([sys.executable, "-m", "swarmyard.cli", "bench", "wasi", "--json", "--quick"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["area"] == "wasi" and summary["calls"] == 50 and summary["fuel_cap"] == 50_000_000
    for key in ("call_ms_p50", "call_ms_p99", "compile_ms", "fuel_trap_s", "wall_trap_s"):
        assert isinstance(summary[key], float) and summary[key] > 0, key
    assert summary["call_ms_p50"] <= summary["call_ms_p99"]


def test_bench_wasi_without_built_modules_says_how_to_build(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SWARMYARD_WASI_DIR": str(tmp_path / "none")}
    done = subprocess.run([sys.executable, "-m", "swarmyard.cli", "bench", "wasi", "--json"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "python -m swarmyard.wasi.build" in done.stderr
