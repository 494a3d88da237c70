"""``workers.baseline`` naming a snapshot that ``swarmyard machines snapshot create`` made: the run's workers start
from its newest version (a file of it reaches the worker's finding), through the console scripts.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.ids import new_id

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]
SEED_TEXT = "the checkout this worker starts from"


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-sb-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _cli(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    return subprocess.run([sys.executable, "-m", "swarmyard.cli", *args], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=600)


def test_a_run_starts_its_workers_from_a_snapshot(folder: Path) -> None:
    name = f"golden-{new_id('s')[-8:].lower()}"
    (folder / "checkout").mkdir()
    (folder / "checkout" / "seed.txt").write_text(SEED_TEXT)
    made = _cli(folder, "machines", "snapshot", "create", name, "--from", "checkout", "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)[0]["version"] == 1
    replies = {
        # the worker reads the snapshot's file with its shell, and its finding is what the shell answered
        "scripted-worker": [{"tool_calls": [{"name": "shell", "arguments": {"command": "cat seed.txt"}}]},
                            {"tool_calls": [{"name": "submit_finding",
                                             "arguments": {"title": "seed", "body": "{{last_message}}"}}]}],
        "scripted-lead": [{"tool_calls": [{"name": "submit_finding",
                                           "arguments": {"title": "synthesis", "body": "Read it."}}]}],
    }
    (folder / "replies.json").write_text(json.dumps(replies))
    (folder / "swarm.toml").write_text(f"""
[goal]
objective = "What does the checkout hold?"
budget_usd = "1"
call_cap = 50
deadline_s = 300
[[tasks.lenses]]
title = "seed"
prompt = "Read seed.txt."
[workers]
count = 1
concurrency = 1
exec_timeout_s = 120
max_steps = 4
model = "scripted-worker"
baseline = "{name}"
[lead]
model = "scripted-lead"
[providers.script]
kind = "scripted"
models = ["scripted-worker", "scripted-lead"]
replies = "replies.json"
[run]
runs_dir = "{folder / 'runs'}"
sandbox = "local"
""")
    try:
        done = _cli(folder, "run", "swarm.toml")
        assert done.returncode == 0, done.stderr[-3000:]
        [run_dir] = (folder / "runs").iterdir()
        with sqlite3.connect(run_dir / "store.db") as db:
            bodies = [str(b) for (b,) in db.execute("SELECT body FROM findings").fetchall()]
        assert any(SEED_TEXT in body for body in bodies), bodies
    finally:
        gone = _cli(folder, "machines", "snapshot", "delete", name)
        assert gone.returncode == 0, gone.stderr
