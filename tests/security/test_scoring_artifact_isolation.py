"""An artifact the scoring code runs cannot forge its score: not by rewriting a report, not by writing into the
scorer's stdout, not by an object that equals everything, not by reading the expected values;
and the scoring sandbox limits processes.

Every test runs the real bubblewrap scoring sandbox on the shipped bundles.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from swarmyard.errors import ScoringError
from swarmyard.evaluator.bundle import Split, load_bundle
from swarmyard.evaluator.client import EvaluatorClient
from swarmyard.evaluator.process import EvaluatorProcess, run_folder
from swarmyard.evaluator.sandbox import BwrapSandbox
from swarmyard.families.code import reference_solution

ROOT = Path(__file__).resolve().parents[2]
CODE = ROOT / "examples" / "code" / "seed-1" / "bundle"
SORT = ROOT / "examples" / "bundles" / "sort-numbers"

pytestmark = pytest.mark.bwrap

FORGE_REPORT = """
import atexit
def _forge():
    with open("report.xml", "w") as f:
        f.write("<testsuite>" + "<testcase name='x'/>" * 100 + "</testsuite>")
atexit.register(_forge)
"""
#: Writes into the stdout of every process it can name: its parent (the scorer), bwrap's PID 1, its neighbours.
WRITE_STDOUTS = """
import os
for pid in {"1", "2", "3", str(os.getppid())}:
    for fd in (0, 1):
        try:
            with open("/proc/%s/fd/%d" % (pid, fd), "w") as out:
                out.write("99999")
        except OSError:
            pass
"""
EQUALS_ANYTHING = """
class _Any:
    def __eq__(self, other):
        return True
def __getattr__(name):
    return lambda *args: _Any()
"""

#: Answers by looking the expected values up in the split's own data, which the sandbox mounts for the scorer.
LOOK_UP_ANSWERS = """
import json
try:
    with open("/eval/data/cases.json") as f:
        _cases = json.load(f)
except OSError:
    _cases = {}
def __getattr__(name):
    table = {json.dumps(args): want for args, want in _cases.get(name, [])}
    return lambda *args: table[json.dumps(list(args))]
"""


def _score(tmp_path: Path, bundle: Path, text: str, split: Split) -> int:
    artifact = tmp_path / "artifact"
    artifact.write_text(text)
    return BwrapSandbox().run(load_bundle(bundle), split, artifact)


@pytest.mark.parametrize("split", [Split.SEARCH, Split.HOLDOUT])
def test_the_reference_solution_scores_full(tmp_path: Path, split: Split) -> None:
    assert _score(tmp_path, CODE, reference_solution(1), split) == 1_000_000


@pytest.mark.parametrize("split", [Split.SEARCH, Split.HOLDOUT])
@pytest.mark.parametrize("attack", [FORGE_REPORT, WRITE_STDOUTS, EQUALS_ANYTHING, FORGE_REPORT + WRITE_STDOUTS,
                                    LOOK_UP_ANSWERS])
def test_a_solution_that_implements_nothing_scores_zero(tmp_path: Path, split: Split, attack: str) -> None:
    assert _score(tmp_path, CODE, attack, split) == 0


def test_a_correct_solution_cannot_add_digits_to_its_score(tmp_path: Path) -> None:
    assert _score(tmp_path, CODE, reference_solution(1) + WRITE_STDOUTS, Split.HOLDOUT) == 1_000_000


def test_a_sorting_program_cannot_write_into_the_scorers_stdout(tmp_path: Path) -> None:
    assert _score(tmp_path, SORT, WRITE_STDOUTS, Split.SEARCH) == 0


def test_a_score_above_the_declared_maximum_is_a_scoring_error_that_quotes_nothing(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(SORT, bundle)
    (bundle / "score.py").write_text("print(91000000)\n")
    with pytest.raises(ScoringError) as caught:
        _score(tmp_path, bundle, "", Split.SEARCH)
    assert caught.value.reason == "out_of_range"
    assert "91000000" not in str(caught.value.to_dict())


@pytest.mark.parametrize("printed", ["-5", "1\n2", "12abc", "0" * 40, "007"])
def test_anything_but_one_integer_line_is_bad_output(tmp_path: Path, printed: str) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(SORT, bundle)
    (bundle / "score.py").write_text(f"print({printed!r})\n")
    with pytest.raises(ScoringError) as caught:
        _score(tmp_path, bundle, "", Split.SEARCH)
    assert caught.value.reason == "bad_output"


FORK_SCORER = """
import os, time
n = 0
for _ in range(400):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(2)
        os._exit(0)
    n += 1
print(n)
"""
needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root (serve drops to its own user) and setpriv")


def _serve_score(tmp_path: Path, scorer: str, artifact: str, busy: int) -> int:
    # Through a real ``evaluator serve``: started as root it drops to a user of its own, as a run's does (root is
    # exempt from RLIMIT_NPROC). ``busy`` processes of that user run meanwhile.
    bundle = tmp_path / "bundle"
    shutil.copytree(SORT, bundle)
    if scorer:
        (bundle / "score.py").write_text(scorer)
    run_id = f"run_nproc_{uuid.uuid4().hex[:12]}"
    try:
        with EvaluatorProcess.start(bundle, run_id=run_id, goal="goal_nproc") as evaluator:
            assert evaluator.own_user
            uid = pwd.getpwnam(evaluator.user).pw_uid
            sleepers = [subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep",
                                          "600"]) for _ in range(busy)]
            try:
                with EvaluatorClient(evaluator.socket) as client:
                    return client.score("goal_nproc", artifact.encode()).score
            finally:
                for sleeper in sleepers:
                    sleeper.kill()
                    sleeper.wait()
    finally:
        shutil.rmtree(run_folder(run_id), ignore_errors=True)


@needs_root
def test_the_scoring_sandbox_limits_processes(tmp_path: Path) -> None:
    assert 0 < _serve_score(tmp_path, FORK_SCORER, "", 0) < load_bundle(SORT).limits.max_processes


@needs_root
def test_a_user_that_already_runs_many_processes_still_scores(tmp_path: Path) -> None:
    # the kernel counts every process of the user, so the limit is that many more than it runs now
    sort = "import sys\nprint(*sorted(map(int, sys.stdin.read().split())))\n"
    cases = json.loads((SORT / "search" / "cases.json").read_text())
    assert _serve_score(tmp_path, "", sort, 100) == len(cases)
