"""``swarmyard bench swarm --compare A,B --upstream-latency S --json`` through the console script, at small sizes:
each size a real ``swarmyard run`` in real machines on the simulated upstream. Its figures are measurements and
are not asserted; its shape, and that each figure is read from a run that went to its end, are."""

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


def bench(tmp_path: Path, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    return run_cli("bench", *args, cwd=tmp_path, timeout_s=timeout)


def test_compare_runs_each_size_as_a_real_run_and_reports_the_ratio(tmp_path: Path) -> None:
    done = bench(tmp_path, "swarm", "--compare", "3,1", "--upstream-latency", "0.2", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    assert got["area"] == "swarm" and got["compared"] == [1, 3] and got["upstream_latency_s"] == 0.2
    for n in (1, 3):
        # every run went through to its lead, which wrote the synthesis: the run succeeded
        assert got[f"run_exit_code_{n}"] == 0
        assert got[f"run_wall_s_{n}"] > 0 and got[f"run_tail_s_{n}"] >= 0
        # its workers' first calls came after the run began and before it closed
        assert 0 < got[f"run_last_first_call_s_{n}"] < got[f"run_wall_s_{n}"]
        # the host's cores were busy with the run (its machines, its agents), and no more than all of them
        assert 0 < got[f"run_host_busy_{n}"] <= 1 and got[f"run_host_cpu_s_per_worker_{n}"] > 0
        # the run's own process tree (plane, sandboxes, agents) used CPU, within what the cores had
        assert got[f"run_own_cpu_s_per_worker_{n}"] > 0 and 0 < got[f"run_own_cpu_share_{n}"] <= 1
    assert got["run_compare_ratio"] == pytest.approx(got["run_wall_s_3"] / got["run_wall_s_1"], rel=1e-2)
    assert not any("machines made" in note for note in got["notes"])  # one machine per worker and the lead's
    assert not any("swarmyard run exit" in note for note in got["notes"])


@pytest.mark.parametrize(("args", "said"), [
    (("swarm", "--compare", "10"), "two or more worker counts"),
    (("swarm", "--compare", "10,x"), "worker counts such as 10,200"),
    (("swarm", "--compare", "0,10"), "two or more worker counts from 1"),
    (("swarm", "--compare", "10,200", "--sandboxed"), "takes no --workers, --sandboxed or --quick"),
    (("store", "--compare", "10,200"), "takes no --compare"),
    (("swarm", "--upstream-latency", "2"), "goes with --compare"),
])
def test_compare_refuses_what_it_cannot_run(tmp_path: Path, args: tuple[str, ...], said: str) -> None:
    done = bench(tmp_path, *args, timeout=120)
    assert done.returncode == 1 and said in done.stderr, done.stderr[-2000:]
