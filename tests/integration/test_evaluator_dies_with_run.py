"""A run's evaluator dies with the process that started it, even one killed with SIGKILL, so a resumed run
starts its own instead of finding the old one still serving on the run's socket."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from swarmyard.evaluator.process import EvaluatorProcess, run_folder

BUNDLE = Path(__file__).resolve().parents[2] / "examples" / "bundles" / "sort-numbers"
PARENT = """
import sys
from pathlib import Path
from swarmyard.evaluator.process import EvaluatorProcess
evaluator = EvaluatorProcess.start(Path(sys.argv[1]), run_id=sys.argv[2], goal="goal_dies_with_run")
print(evaluator.pid, flush=True)
sys.stdin.read()  # until the test kills this process
"""

pytestmark = pytest.mark.bwrap


def test_the_evaluator_stops_when_its_run_is_killed_and_the_run_resumes() -> None:
    run_id = f"run_dies_{uuid.uuid4().hex[:12]}"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(BUNDLE), run_id], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        evaluator_pid = int(parent.stdout.readline())
        watch = os.pidfd_open(evaluator_pid)
        try:
            parent.send_signal(signal.SIGKILL)
            parent.wait()
            ready, _, _ = select.select([watch], [], [], 60)  # readable once the evaluator has exited
            assert ready, "the evaluator outlived the run that started it"
        finally:
            os.close(watch)
        with EvaluatorProcess.start(BUNDLE, run_id=run_id, goal="goal_dies_with_run") as again:
            assert again.pid != evaluator_pid
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        shutil.rmtree(run_folder(run_id), ignore_errors=True)
