"""Every trial counts, through the ``swarmyard`` console script with real runs: a trial that timed out, whose
workers' model failed on every call, or whose scorer crashed on every submission is a failed trial. It scores 0
(the floor) in its cell, is listed with its reason, and its cell's failure rate shows it.

Before, each of these was recorded as a trial that ran and scored (an error-free record): a 3-second deadline
that stopped the worker part way kept the score it had by then (125,000 on seed 1), and a provider that answered
every call with a 500 or a scorer that exited at once each scored 0 with no reason and a failure rate of 0%.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "examples" / "bundles" / "hidden-code"
SWARM = (REPO / "examples" / "campaigns" / "hidden-code-simulated.toml").read_text()
SCRIPTED = SWARM.split("[providers.sim]")[0] + '[providers.sim]\nkind = "scripted"\nmodels = ["sim"]\nreplies = "replies.json"\n'


def _campaign(folder: Path, swarm: str, bundle: str, extra: str = "") -> dict[str, object]:
    (folder / "s.toml").write_text(swarm.replace('bundle = "../bundles/hidden-code"', f'bundle = "{bundle}"')
                                   .replace("[workers]", "[workers]\nmax_failures = 1"))
    (folder / "c.toml").write_text(f'[campaign]\nname = "f"\nswarm = "s.toml"\nseeds = [1]\n{extra}'
                                   '[[cells]]\nname = "one"\n')
    script = shutil.which("swarmyard")
    assert script is not None, "the swarmyard console script is installed"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    for name in ("XDG_CACHE_HOME", "SWARMYARD_STATE_DIR"):
        if name in os.environ:
            env[name] = os.environ[name]
    done = subprocess.run([script, "campaign", "c.toml", "--json"], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]  # every trial ran: a failed trial is a result, not an error
    result: dict[str, object] = json.loads(done.stdout)
    return result


def _failed_as(folder: Path, result: dict[str, object], reason: str) -> None:
    (cell,) = result["cells"]  # type: ignore[misc]
    (trial,) = cell["trials"]
    assert trial["error"] is not None and trial["error"].startswith(reason), trial
    assert trial["counted_score"] == 0 and trial["score"] is None
    assert (cell["failed"], cell["failure_rate"], cell["mean"]) == (1, 1.0, 0)
    report = (folder / "campaigns" / "f" / "campaign.md").read_text()
    assert f"- one seed 1: {reason}" in report and "1/1 (100%)" in report
    assert (folder / "campaigns" / "f" / trial["report"]).is_file()  # the failed trial's own report is linked


@pytest.mark.slow
def test_a_trial_whose_deadline_stops_it_is_a_failure(short_tmp: Path) -> None:
    result = _campaign(short_tmp, SWARM, BUNDLE.as_posix(), "deadline_s = 3\n")
    _failed_as(short_tmp, result, "timeout: the deadline of 3 s passed before the workers' tasks ended")


@pytest.mark.slow
def test_a_trial_whose_model_fails_every_call_is_a_failure(short_tmp: Path) -> None:
    (short_tmp / "replies.json").write_text(json.dumps({"*": [{"fail": "status_500"}] * 50}))
    result = _campaign(short_tmp, SCRIPTED, BUNDLE.as_posix())
    _failed_as(short_tmp, result, "trial_failed: none of its 1 worker tasks finished")


@pytest.mark.slow
def test_a_trial_whose_scorer_crashes_is_a_failure(short_tmp: Path) -> None:
    shutil.copytree(BUNDLE, short_tmp / "bundle")
    (short_tmp / "bundle" / "score.py").write_text('raise SystemExit("the scorer crashed")\n')
    result = _campaign(short_tmp, SWARM, "bundle")
    _failed_as(short_tmp, result, "not_scored: the evaluator scored nothing in this run")
