"""``swarmyard run`` with a call cap takes the escrow path: every model call is held on its task's row.

Through the console script, in real machines, on the scripted provider. The goal caps calls at 12 and has three
lenses: each lens task is allocated 3 calls when it is made (12 // (3 + 1), a share held back for the lead), and
its claim carves them into its slice with its budget. Each scout makes one call and is done: its 2 unused calls go
back to the goal, so the lead is allocated the 9 calls no task holds (before, the lead got the 3 the lenses' caps
left: a done task's unused calls stayed allocated to it). A trigger on the goals table records every write of the
goal's call count: a call charged on the goal's row adds one without moving the escrowed calls, a returned slice
moves both. Before calls were escrowed, a goal that capped calls gave no slices, and every call of every run was
charged on the goal's row.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from invariants import check_run
from rigs.scripted import tool_call
from rigs.swarm_files import scripted_swarm
from swarmyard.store import open_store

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

CAP = 12
LENSES = [("market", "Size the market."), ("risks", "Name the risks."), ("costs", "Estimate the costs.")]


def test_a_runs_calls_are_held_on_its_tasks_slices_within_the_cap(short_tmp: Path) -> None:
    swarm = scripted_swarm(short_tmp, lenses=LENSES, call_cap=CAP)
    (swarm.parent / "replies").mkdir()
    (swarm.parent / "replies" / "answers.json").write_text(json.dumps({
        "scripted-worker": [tool_call("submit_finding", title=title, body=f"What the {title} lens found.")
                            for title, _ in LENSES],
        "scripted-lead": [tool_call("submit_finding", title="synthesis", body="Go.")],
    }))
    db = short_tmp / "store.db"
    swarm.write_text(swarm.read_text() + f'store = "sqlite:///{db}"\n')
    open_store(f"sqlite:///{db}").close()  # the schema, so that a trigger can be put on it
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE call_writes (calls_before INTEGER, calls_after INTEGER, escrowed_before "
                     "INTEGER, escrowed_after INTEGER)")
        conn.execute("CREATE TRIGGER call_write AFTER UPDATE OF calls ON goals WHEN NEW.calls <> OLD.calls BEGIN "
                     "INSERT INTO call_writes VALUES (OLD.calls, NEW.calls, OLD.escrowed_calls, "
                     "NEW.escrowed_calls); END")
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           "HOME": str(short_tmp), "LANG": "C.UTF-8"}
    done = subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm), "--json"], cwd=short_tmp,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout)
    [run_dir] = (short_tmp / "runs").iterdir()
    with sqlite3.connect(db) as conn:
        tasks = {str(title): (str(state), int(cap), int(calls)) for title, state, cap, calls in conn.execute(
            "SELECT title, state, call_cap, calls FROM tasks")}
        holds = conn.execute("SELECT task_id, slice_token FROM reservations").fetchall()
        writes = conn.execute("SELECT * FROM call_writes").fetchall()
        events = [(str(kind), json.loads(body)) for kind, body in conn.execute("SELECT kind, body FROM events")]
        [(goal_calls, allocated_calls, escrowed_calls)] = conn.execute(
            "SELECT calls, allocated_calls, escrowed_calls FROM goals").fetchall()

    # every task ran and made its one call, within its own cap (an ended task's cap is the calls it made)
    assert tasks == {**{title: ("done", 1, 1) for title, _ in LENSES}, "synthesis": ("done", 1, 1)}, tasks
    assert figures["calls"] == len(holds) == goal_calls == 4 <= CAP
    made = {str(body["title"]): int(body["call_cap"]) for kind, body in events if kind == "task.created"}
    assert made == {**{title: CAP // (len(LENSES) + 1) for title, _ in LENSES}, "synthesis": CAP - 3}, made
    # each claim carved its task's calls into its slice, and every call was held there, on the task's row
    carved = [int(body["calls"]) for kind, body in events if kind == "task.slice_carved"]
    assert sorted(carved) == [3, 3, 3, CAP - 3], carved
    assert holds and all(token is not None for _, token in holds), holds
    # the goal's call count was written only when a slice came back (its escrowed calls fall), never per call
    assert writes and all(escrowed_after < escrowed_before for _, _, escrowed_before, escrowed_after in writes), writes
    assert sum(after - before for before, after, _, _ in writes) == 4
    # the unused calls went back: the goal holds allocated only the calls made, none escrowed
    assert (allocated_calls, escrowed_calls) == (4, 0)
    check_run(f"sqlite:///{db}", run_dir)
