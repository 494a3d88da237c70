"""``swarmyard run`` killed with SIGKILL while model calls are in flight, then ``swarmyard run --resume RUN``:
the holds the killed run's broker had made stay ``held`` in the store, since no process is left to settle or
release them. They were left so for good (the resumed run completed and counted them among its leftover holds
with no state saying why); the resume now marks each ``unknown`` (reconcilable) before any new work starts.

The workers run on the simulated provider, priced, each answer a second and a half long, so a kill lands on calls
in flight: the test polls the run's store until a hold is ``held`` and kills the runner then. The lead's answers
come at once (a second simulated provider): its twelve calls are not what the test is about.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_faults import _env, _finish, _rows, _run_dir, _start, _until

from rigs.outcomes import assert_simulated_lead_ended
from rigs.swarm_files import simulated_swarm

pytestmark = [
    pytest.mark.faults,
    pytest.mark.bwrap,
    pytest.mark.slow,
]

LENSES = 6
#: The workers' lease. The tasks the killed run held without a finding stay claimed until their lease lapses, and
#: only then does the resumed run take them again: with the default (120 s) that wait was most of the test. A
#: worker renews its claim at every step (three calls, 4.5 s here), and the lead, whose answers are not slow, ends
#: well within it.
LEASE_S = 30


def _swarm(folder: Path) -> Path:
    return simulated_swarm(folder, objective="Count things", budget_usd="5", call_cap=500, deadline_s=900,
                           lenses=[(f"lens {i}", f"Say one fact about {i}.") for i in range(LENSES)],
                           workers={"count": LENSES, "concurrency": 3, "max_steps": 3, "lease_s": LEASE_S},
                           latency_s=1.5, fast_lead=True)


def test_the_holds_a_killed_run_left_held_are_unknown_after_resume(short_tmp: Path) -> None:
    swarm = _swarm(short_tmp)
    runner = _start(short_tmp, swarm)
    try:
        held = _until(runner, lambda: _rows(short_tmp, "SELECT id FROM reservations WHERE state = 'held'") or None,
                      "a model call was in flight")
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=120)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == -signal.SIGKILL
    run_dir = _run_dir(short_tmp)
    assert run_dir is not None
    left = {row[0] for row in _rows(short_tmp, "SELECT id FROM reservations WHERE state = 'held'")}
    assert {row[0] for row in held} <= left  # what was in flight at the kill is still held: no one ended it
    resumed = _start(short_tmp, swarm, "--resume", run_dir.name)
    code, _, err = _finish(resumed)
    assert_simulated_lead_ended(code, err)
    states = dict(_rows(short_tmp, "SELECT id, state FROM reservations"))
    assert "held" not in states.values(), [i for i, s in states.items() if s == "held"]
    assert {states[i] for i in left} == {"unknown"}  # the killed run's, each reconcilable now
    assert sorted(s for (s,) in _rows(short_tmp, "SELECT state FROM tasks")) == ["done"] * (LENSES + 1)
    verify = subprocess.run([sys.executable, "-m", "swarmyard.cli", "audit", "verify", str(run_dir)],
                            cwd=short_tmp, env=_env(short_tmp), capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "tables match" in verify.stdout
