"""``workers.baseline`` naming a snapshot that ``swarmyard machines snapshot create`` made: the run's workers start
from its newest version (a file of it reaches the worker's finding), through the console scripts.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from rigs.cli import run_cli
from rigs.scripted import tool_call
from rigs.swarm_files import scripted_run
from swarmyard.ids import new_id

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]
SEED_TEXT = "the checkout this worker starts from"


def test_a_run_starts_its_workers_from_a_snapshot(short_tmp: Path) -> None:
    folder = short_tmp
    name = f"golden-{new_id('s')[-8:].lower()}"
    (folder / "checkout").mkdir()
    (folder / "checkout" / "seed.txt").write_text(SEED_TEXT)
    made = run_cli("machines", "snapshot", "create", name, "--from", "checkout", "--json", cwd=folder)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)[0]["version"] == 1
    replies = {
        # the worker reads the snapshot's file with its shell, and its finding is what the shell answered
        "scripted-worker": [tool_call("shell", command="cat seed.txt"),
                            tool_call("submit_finding", title="seed", body="{{last_message}}")],
        "scripted-lead": [tool_call("submit_finding", title="synthesis", body="Read it.")],
    }
    swarm = scripted_run(folder, replies, objective="What does the checkout hold?", lens=("seed", "Read seed.txt."),
                         workers={"exec_timeout_s": 120, "max_steps": 4, "baseline": name})
    try:
        done = run_cli("run", str(swarm), cwd=folder)
        assert done.returncode == 0, done.stderr[-3000:]
        [run_dir] = (folder / "runs").iterdir()
        with sqlite3.connect(run_dir / "store.db") as db:
            bodies = [str(b) for (b,) in db.execute("SELECT body FROM findings").fetchall()]
        assert any(SEED_TEXT in body for body in bodies), bodies
    finally:
        gone = run_cli("machines", "snapshot", "delete", name, cwd=folder)
        assert gone.returncode == 0, gone.stderr
