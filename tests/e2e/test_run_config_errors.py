"""``swarmyard run`` refuses a swarm file that cannot run on this host with one line and exit 1, before any run
folder, store, goal, socket or evaluator exists: an unknown sandbox, a missing baseline, an unpriced model, a
missing or malformed evaluator bundle, an agent with a baseline of its own beside another."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from rigs.cli import cli_env, run_cli

EXAMPLE_BUNDLE = Path(__file__).resolve().parents[2] / "examples" / "bundles" / "sort-numbers"

SWARM = """[goal]
objective = "Sort numbers."
budget_usd = "1"
[[tasks.lenses]]
title = "sorter"
[workers]
model = "scripted-worker"
[lead]
model = "scripted-worker"
[providers.script]
kind = "scripted"
models = ["scripted-worker"]
replies = "replies.json"
"""


@pytest.fixture
def folder(short_tmp: Path) -> Path:
    return short_tmp


def _run(folder: Path, text: str) -> subprocess.CompletedProcess[str]:
    (folder / "conf").mkdir(exist_ok=True)
    (folder / "conf" / "swarm.toml").write_text(text)
    (folder / "conf" / "replies.json").write_text('{"*": [{"say": "done"}]}')
    env = cli_env(folder, TMPDIR=str(folder / "tmp"), SWARMYARD_STATE_DIR=str(folder / "state"))
    (folder / "tmp").mkdir(exist_ok=True)
    return run_cli("run", "conf/swarm.toml", cwd=folder, env=env, timeout_s=120)


def _bad_bundle(folder: Path) -> None:
    shutil.copytree(EXAMPLE_BUNDLE, folder / "conf" / "bundle")
    (folder / "conf" / "bundle" / "evaluator.toml").write_text('name = "Not A Name"\n[scoring]\nentry = "score.py"\n')


def _missing_split(folder: Path) -> None:
    shutil.copytree(EXAMPLE_BUNDLE, folder / "conf" / "bundle")
    shutil.rmtree(folder / "conf" / "bundle" / "holdout")


CASES = [
    pytest.param('[run]\nsandbox = "hyperv"\n', None, "run.sandbox", "'local', 'process' or 'ray'", id="unknown-sandbox"),
    pytest.param('[run]\nsandbox = "process"\n', None, "workers.baseline", "no baseline named 'nowhere-repo'",
                 id="missing-baseline"),
    pytest.param('[providers.house]\nkind = "openai_compatible"\nbase_url = "http://127.0.0.1:9/v1"\n'
                 'models = ["house-7"]\n', None, "providers.house", "price", id="unpriced-model"),
    pytest.param('[evaluator]\nbundle = "no-such-bundle"\n', None, "evaluator.bundle", "is not a folder",
                 id="missing-bundle"),
    pytest.param('[evaluator]\nbundle = "bundle"\n', _bad_bundle, "evaluator.bundle", "name", id="bad-bundle"),
    pytest.param('[evaluator]\nbundle = "bundle"\n', _missing_split, "evaluator.bundle", "holdout/",
                 id="bundle-without-holdout"),
]


@pytest.mark.parametrize(("extra", "setup", "field", "words"), CASES)
def test_a_file_that_cannot_run_is_one_line_and_exit_1_before_anything_exists(
        folder: Path, extra: str, setup: object, field: str, words: str) -> None:
    (folder / "conf").mkdir()
    if callable(setup):
        setup(folder)
    text = SWARM + extra
    if "baseline" in field:
        text = text.replace('[workers]\n', '[workers]\nbaseline = "nowhere-repo"\n')
    done = _run(folder, text)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "config_error" in lines[0] and field in lines[0] and words in lines[0], lines[0]
    assert done.stdout == ""
    # nothing was made: no run folder (so no store and no goal), no secrets, no evaluator folder
    assert sorted(p.name for p in folder.iterdir()) == ["conf", "tmp"]
    assert list((folder / "tmp").iterdir()) == []
    assert sorted(p.name for p in (folder / "conf").iterdir()) == sorted(
        ["swarm.toml", "replies.json", *(["bundle"] if (folder / "conf" / "bundle").exists() else [])])


def test_the_same_file_with_a_good_bundle_gets_past_the_bundle_check(folder: Path) -> None:
    (folder / "conf").mkdir()
    shutil.copytree(EXAMPLE_BUNDLE, folder / "conf" / "bundle")
    text = SWARM.replace("[workers]\n", '[workers]\nbaseline = "nowhere-repo"\n')
    done = _run(folder, text + '[evaluator]\nbundle = "bundle"\n[run]\nsandbox = "process"\n')
    # the next thing wrong is named instead: the bundle passed
    assert done.returncode == 1
    assert "evaluator" not in done.stderr and "workers.baseline" in done.stderr, done.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["conf", "tmp"]
