"""``swarmyard bench faults``: each fault case is a real run that survives, with its recovery time; a run that
does not get through its fault is reported as not survived, with why.

Through the console script for the figures (subprocess, exit code asserted); a case whose fault is never
recovered from (the runner is killed and not resumed) through ``run_case`` with that case added.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable

import pytest

from swarmyard.bench import faults
from swarmyard.machines.cgroups import discover, group_folders

pytestmark = [
    pytest.mark.faults,
    pytest.mark.bwrap,
    pytest.mark.slow,
]


def test_bench_faults_reports_every_case_survived_with_its_recovery_time() -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"),
           "LANG": "C.UTF-8"}
    done = subprocess.run([sys.executable, "-m", "swarmyard.cli", "bench", "faults", "--json"], env=env,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["area"] == "faults"
    assert set(summary["cases"]) == {"worker_kill", "runner_kill", "upstream_drop"}
    for name, case in summary["cases"].items():
        assert case["survived"] is True, (name, case)
        assert case["recovery_s"] > 0, (name, case)
    assert (summary["survived"], summary["of"]) == (3, 3)


def test_a_fault_the_run_does_not_get_through_is_reported_not_survived(monkeypatch: pytest.MonkeyPatch) -> None:
    def kill_and_leave(run: faults._Run) -> float | None:  # the runner_kill case without its resume
        runner = run.start()
        run.until(runner, lambda: True if run.rows("SELECT id FROM findings") else None, "a finding")
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait()
        return 0.0

    replies, lenses, max_failures, _ = faults.CASES["runner_kill"]
    monkeypatch.setitem(faults.CASES, "unresumed", (replies, lenses, max_failures, kill_and_leave))
    seen: list[faults._Run] = []
    monkeypatch.setattr(faults._Run, "close", _recording(faults._Run.close, seen))
    case = faults.run_case("unresumed")
    assert case.survived is False
    assert case.why.startswith("tasks ended") and "not all done" in case.why, case.why
    assert len(seen) == 1  # what the killed runner left was reaped when the case ended (see _recording)


def _recording(close: Callable[[faults._Run], None], seen: list[faults._Run]) -> Callable[[faults._Run], None]:
    def recorded(run: faults._Run) -> None:
        left = sorted(p.name for p in (run.machines / "m").iterdir())
        assert left, "the killed runner left no machine folder"
        close(run)
        assert not any((run.machines / "m").iterdir())
        hierarchy = discover()
        assert not [g for name in left for g in group_folders(hierarchy, name) if g.exists()]
        seen.append(run)

    return recorded
