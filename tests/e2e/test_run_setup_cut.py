"""A run whose store fails while it makes its goal's first tasks is resumed to its end, each task made once.

The goal and the first round's tasks are made one transaction each. Before, ``run.json`` was written only after
the last of them, so a store failure in between (a PostgreSQL restart: an attack restarted the server as the
tasks were being made, 11 runs of 11) left a goal with some tasks and no run to resume: ``--resume`` said "no
run to resume". Here a trigger makes the store refuse the third task, through the real ``swarmyard run``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from rigs.outcomes import assert_simulated_lead_ended
from rigs.swarm_files import simulated_swarm
from swarmyard.store import open_store

pytestmark = [pytest.mark.bwrap]

LENSES = [(f"lens {i}", f"Look at lens {i}.") for i in range(6)]


def test_a_run_cut_while_making_its_tasks_resumes_and_makes_each_once(short_tmp: Path) -> None:
    swarm = simulated_swarm(short_tmp, objective="Should a small team bet on speech models?", lenses=LENSES,
                            workers={"count": 3, "concurrency": 2, "max_steps": 2, "exec_timeout_s": 120},
                            call_cap=200)
    db = short_tmp / "store.db"
    swarm.write_text(swarm.read_text() + f'store = "sqlite:///{db}"\n')
    open_store(f"sqlite:///{db}").close()  # the schema, so that a trigger can be put on it
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TRIGGER cut BEFORE INSERT ON tasks WHEN (SELECT count(*) FROM tasks) >= 2 "
                     "BEGIN SELECT RAISE(ABORT, 'the store failed here'); END")
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           "HOME": str(short_tmp), "LANG": "C.UTF-8"}
    cut = subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm), "--json"], cwd=short_tmp,
                         env=env, capture_output=True, text=True, timeout=600)
    assert cut.returncode == 1 and "the store failed here" in cut.stderr, cut.stderr[-3000:]
    [run_dir] = (short_tmp / "runs").iterdir()
    assert json.loads((run_dir / "run.json").read_text())["tasks_made"] is False
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TRIGGER cut")
        assert conn.execute("SELECT count(*) FROM tasks").fetchone() == (2,)

    resumed = subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm), "--resume", run_dir.name,
                              "--json"], cwd=short_tmp, env=env, capture_output=True, text=True, timeout=600)
    assert_simulated_lead_ended(resumed.returncode, resumed.stderr)
    with sqlite3.connect(db) as conn:
        titles = [t for (t,) in conn.execute("SELECT title FROM tasks WHERE title LIKE 'lens %' ORDER BY title")]
        states = dict(conn.execute("SELECT state, count(*) FROM tasks GROUP BY state").fetchall())
        findings = dict(conn.execute("SELECT t.title, count(f.id) FROM tasks t LEFT JOIN findings f "
                                     "ON f.task_id = t.id WHERE t.title LIKE 'lens %' GROUP BY t.id").fetchall())
    assert titles == [title for title, _ in LENSES]  # each made once: the two made before the cut are not again
    assert states == {"done": len(LENSES) + 1}, states  # the lenses and the lead
    assert set(findings.values()) == {1}, findings
    assert json.loads((run_dir / "run.json").read_text())["tasks_made"] is True
