"""The machines benchmark and the doctor, run for real (shape only, no timing assertions)."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from swarmyard.bench.machines import run
from swarmyard.cli.main import app
from swarmyard.machines.cgroups import discover
from swarmyard.machines.idle import host_swap_reason


@pytest.mark.slow
def test_bench_quick_has_the_summary_keys() -> None:
    result = run(quick=True)
    for key in ("create_exec_ms_p50", "create_exec_unparked_ms_p50", "fork_ms_p50", "raw_bwrap_ms_p50", "exec_ms_p50",
                "pause_resume_ms_p50", "create_exec_snapshot_ms_p50", "client_plane_start_s",
                "client_create_ready_exec_ms_p50", "client_create_ratio", "client_fork_ready_ms_p50",
                "client_delete_ms_p50", "client_create_loaded_ratio", "client_load_slowdown",
                "backend_load_slowdown", "wake_exec_ms_p50", "wake_thaw_ms_p50"):
        assert result.summary[key] > 0
    # hibernation: measured where the host has swap, else said not possible with the reason
    if result.summary["hibernate_possible"]:
        assert result.summary["hibernate_released_mb_p50"] > 0 and result.summary["hibernate_wake_exec_ms_p50"] > 0
    else:
        assert "swap" in result.summary["hibernate_reason"]
    assert any(row.baseline for row in result.rows)


def test_doctor_json_reports_every_check() -> None:
    out = CliRunner().invoke(app, ["machines", "doctor", "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert report["landlock_abi"] >= 1 and report["user_namespaces"] is True
    assert {c["name"] for c in report["checks"]} >= {"bubblewrap", "seccomp", "landlock", "overlayfs",
                                                     "private networks", "pause", "fork keeps memory"}
    (fork,) = [c for c in report["checks"] if c["name"] == "fork keeps memory"]
    assert fork["ok"] is False and "disk" in fork["detail"]  # said plainly: no CRIU, a fork is its disk
    (hibernate,) = [c for c in report["checks"] if c["name"] == "hibernate"]
    assert hibernate["ok"] is (host_swap_reason() is None and "memory" in discover().controllers())
    (networks,) = [c for c in report["checks"] if c["name"] == "private networks"]
    assert networks["ok"] is (os.geteuid() == 0)  # root makes them; anyone else is told why not
