"""``swarmyard bench swarm --sandboxed --workers N --json`` through the console script, at a small N: real machines
with the real agent in each. Its figures are measurements and are not asserted; its shape is."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from rigs.cli import run_cli

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]


def bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("bench", "swarm", *args, cwd=tmp_path, timeout_s=1200)


def test_sandboxed_bench_reports_wall_over_ideal_memory_and_saturation(tmp_path: Path) -> None:
    done = bench(tmp_path, "--sandboxed", "--workers", "4", "--quick", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    assert got["area"] == "swarm" and got["sandboxed"] is True and got["workers"] == 4
    assert got["errors"] == 0 and got["findings"] == 4  # every agent took its task and submitted
    # each agent asks three times a step (the simulated answer is no action) for one step
    assert got["calls_per_agent"] == 3 and got["ideal_s"] == 3 * got["latency_s"]
    assert got["overhead_ratio"] == pytest.approx(got["wall_s"] / got["ideal_s"], rel=1e-2)
    assert got["overhead_ratio_sandboxed_4"] == got["overhead_ratio"]
    # the host's MemAvailable is shared with everything else on the host: its fall can be nothing
    assert isinstance(got["memory_per_machine_mib"], int | float)
    for key in ("agent_peak_rss_mib_median", "agent_cpu_s_median",
                "machine_boot_s_median", "server_cpu_ms_per_request", "host_cpu_s_per_agent", "last_agent_up_s"):
        assert isinstance(got[key], int | float) and got[key] > 0, key
    assert 1 <= got["most_alive"] <= 4 and got["cores"] >= 1
    # the host CPU per agent is its parts: the agent's own, the plane's and this bench process's, per agent
    parts = ("agent_cpu_s_mean", "server_cpu_s_per_agent", "bench_cpu_s_per_agent")
    assert all(got[key] > 0 for key in parts), {key: got[key] for key in parts}
    assert sum(got[key] for key in parts) == pytest.approx(got["host_cpu_s_per_agent"], abs=0.003)
    # where the time went before each agent's first call: every phase measured, none past the run's end
    for phase in ("boot", "start", "to_call", "first_call"):
        assert 0 < got[f"phase_{phase}_s_median"] <= got[f"phase_{phase}_s_p90"] < got["wall_s"], phase
    assert got["phase_first_call_s_p90"] <= got["last_first_call_s"] < got["wall_s"]
    # the host's cores until the last agent's first call: some share of them busy (booting and starting agents
    # is work), never more than all of them
    assert 0 < got["host_busy_ramp"] <= 1 and got["host_cpu_s_ramp_per_agent"] > 0
    assert got["agents_started_per_ideal"] >= 0 and got["agents_fitting_in_memory"] >= 0
    assert any("real local machines" in note for note in got["notes"])


def test_sandboxed_is_an_option_of_the_swarm_bench_only(tmp_path: Path) -> None:
    done = run_cli("bench", "store", "--sandboxed", cwd=tmp_path, timeout_s=120)
    assert done.returncode == 1 and "takes no --sandboxed" in done.stderr
