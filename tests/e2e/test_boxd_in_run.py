"""``Boxd()`` in code that runs inside a machine makes machines only through the spawn capability.

A run's worker has none: its shell's program (``Boxd()`` then a create) is refused with a typed error that names
the capability, and no control plane or sandbox starts inside the machine (``swarmyard run`` through the console
script, the worker's finding is what its shell printed). A coordinator machine, made with ``spawn=True`` by a Boxd
client, has it: its ``Boxd()`` makes machines on that client's plane (their goal is the client's), and a
``Boxd(providers=...)`` that would start a plane of its own in there is refused.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

from rigs.cli import run_cli
from rigs.scripted import tool_call
from rigs.swarm_files import scripted_run
from swarmyard.boxd import Boxd

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

_TRY = """
from swarmyard.boxd import Boxd
from swarmyard.errors import SwarmyardError
try:
    Boxd().machines.create("made-inside")
except SwarmyardError as exc:
    print("refused", type(exc).__name__, exc.message)
else:
    print("made a machine")
"""


@pytest.fixture
def folder(short_tmp: Path) -> Path:
    return short_tmp


def test_a_run_worker_without_spawn_is_refused_a_boxd_client(folder: Path) -> None:
    replies = {
        "scripted-worker": [
            tool_call("write_file", path="try.py", content=_TRY),
            tool_call("shell", command=f"{sys.executable} try.py 2>&1"),
            tool_call("submit_finding", title="boxd", body="{{last_message}}"),
        ],
        "scripted-lead": [tool_call("submit_finding", title="synthesis", body="Read it.")],
    }
    swarm = scripted_run(folder, replies, objective="Can a worker make machines?", lens=("boxd", "Try Boxd()."),
                         workers={"exec_timeout_s": 120, "max_steps": 5})
    done = run_cli("run", str(swarm), cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    [run_dir] = (folder / "runs").iterdir()
    with sqlite3.connect(run_dir / "store.db") as db:
        bodies = [str(b) for (b,) in db.execute("SELECT body FROM findings WHERE title = 'boxd'").fetchall()]
    assert len(bodies) == 1, bodies
    assert "refused UserError" in bodies[0] and "spawn capability" in bodies[0] and "spawn=True" in bodies[0]
    assert "made a machine" not in bodies[0]


def test_a_coordinator_machine_makes_machines_on_its_clients_plane_only(folder: Path) -> None:
    (folder / "providers.toml").write_text('[providers.sim]\nkind = "simulated"\nmodels = ["m1"]\n')
    program = _TRY + """
try:
    Boxd(providers="providers.toml")
except SwarmyardError as exc:
    print("refused", type(exc).__name__, exc.message)
"""
    with Boxd(providers=folder / "providers.toml") as boxd:
        coordinator = boxd.machines.create("coordinator", spawn=True)
        boxd.machines.wait_until_ready(coordinator.id)
        boxd.machines.files.upload(coordinator.id, "try.py", program)
        boxd.machines.files.upload(coordinator.id, "providers.toml", (folder / "providers.toml").read_text())
        done = boxd.machines.exec(coordinator.id, "python3 try.py", timeout=300)
        assert done.success, done.stderr[-3000:]
        first, second = done.stdout.splitlines()
        assert first == "made a machine"
        assert second.startswith("refused UserError") and "takes no server, providers or model" in second
        # the client's own machine (named in the coordinator's namespace), logged in under the client's goal
        made = boxd.machines.get("coordinator.made-inside")
        plane = boxd._plane
        assert plane is not None
        kept = boxd._local._kept[made.id]
        task = plane._call("GET", f"/v1/operator/tasks/{kept.login.task_id}")
        assert task["task"]["goal_id"] == boxd.goal_id
