"""``swarmyard run --json`` with the ``explore`` policy, through the console script on the scripted provider and the
hidden-code evaluator bundle: eight workers, twelve directions, and every attempt scores the same (one constant
guess), so no direction is ever clearly better and every worker switches after ``patience = 1`` attempt without
a better score. Untried-first holds across the whole run: every direction is taken once before any is taken
again (read from the store's ``direction.claimed`` events), and the takes after that go to the least-tried.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from rigs.scripted import tool_call as _tool

pytestmark = [pytest.mark.slow]

BUNDLE = Path(__file__).resolve().parents[2] / "examples" / "bundles" / "hidden-code"
DIRECTIONS = tuple(f"d{i:02d}" for i in range(1, 13))
GUESS = "instance 1 code 0000000000000000"


def _swarm(folder: Path, *, workers: int, concurrency: int) -> Path:
    conf = folder / "conf"
    (conf / "bundles").mkdir(parents=True)
    shutil.copytree(BUNDLE, conf / "bundles" / "hidden-code")
    # the same guess every time, whoever asks: the order in which workers take replies does not matter
    worker = [_tool("submit_artifact", content=GUESS)] * 400
    lead = [_tool("submit_finding", title="synthesis", body="Every direction scored the same on the constant guess.")]
    (conf / "replies.json").write_text(json.dumps({"scripted-worker": worker, "scripted-lead": lead}))
    lenses = "".join(f'[[tasks.lenses]]\ntitle = "slot {i}"\nprompt = "Guess the 16-digit code of instance 1."\n'
                     for i in range(1, workers + 1))
    path = conf / "swarm.toml"
    path.write_text(f"""
[goal]
objective = "Find the hidden 16-digit code of instance 1."
budget_usd = "5"
call_cap = 600
deadline_s = 600
{lenses}
[policy]
kind = "explore"
patience = 1
adopt_margin = 1
directions = {json.dumps(list(DIRECTIONS))}
[workers]
count = {workers}
concurrency = {concurrency}
exec_timeout_s = 300
max_steps = 5
model = "scripted-worker"
retry_backoff_s = 0.2
[lead]
model = "scripted-lead"
[providers.script]
kind = "scripted"
models = ["scripted-worker", "scripted-lead"]
replies = "replies.json"
[evaluator]
bundle = "bundles/hidden-code"
[run]
runs_dir = "{folder / 'runs'}"
sandbox = "process"
""")
    return path


def _run(folder: Path, swarm: Path) -> tuple[dict[str, Any], Path]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8",
           "TMPDIR": tempfile.gettempdir(), "SWARMYARD_STATE_DIR": str(folder / "state")}
    done = subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm), "--json"], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    [run_dir] = (folder / "runs").iterdir()
    return json.loads(done.stdout.strip().splitlines()[-1]), run_dir


def _takes(run_dir: Path) -> list[tuple[str, str]]:
    """(direction, worker) of every take, in the order the store made them."""
    with sqlite3.connect(run_dir / "store.db") as db:
        rows = db.execute("SELECT body FROM events WHERE kind = 'direction.claimed' ORDER BY id").fetchall()
    out = []
    for (body,) in rows:
        data = json.loads(body)
        out.append((str(data["direction"]), str(data["worker"])))
    return out


def test_explore_tries_every_direction_before_any_is_taken_again(short_tmp: Path) -> None:
    figures, run_dir = _run(short_tmp, _swarm(short_tmp, workers=8, concurrency=8))
    takes = _takes(run_dir)
    names = [name for name, _ in takes]
    assert set(names) == set(DIRECTIONS), f"some direction was never tried: {names}"
    first = names[: len(DIRECTIONS)]
    assert sorted(first) == sorted(DIRECTIONS), f"a direction was taken again before all were tried: {names}"
    with sqlite3.connect(run_dir / "store.db") as db:
        movers = db.execute("SELECT COUNT(DISTINCT worker_id) FROM scores WHERE split = 'search'").fetchone()[0]
    assert movers == 8 and figures["workers"] >= 8
