"""A PostgreSQL restart in the middle of a run: the run goes on and completes (or, when the restart ended a
transaction in flight, stops and its ``--resume`` completes it), and loses nothing.

The test owns its server (``scripts/pg-test-server`` on a private port and socket folder, never the suite's
shared one), runs ``swarmyard run --json`` on the simulated provider with the store there, and restarts the
server once the run has written its first findings (by progress: it watches the store, not a clock). Before, the
pool handed out a connection the restarted server had closed and the run died with ``AdminShutdown``.
Asserted: exit 0 with a synthesis, every task done exactly once with one finding each, no hold left, fencing
tokens never reused, and ``swarmyard audit verify`` accepts the log and the tables.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from invariants import MachineWatch, check_run, machines_root
from rigs.outcomes import LEAD_NO_RESULT, assert_simulated_lead_ended

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.postgres, pytest.mark.bwrap]

ROOT = Path(__file__).resolve().parents[2]
PG_SERVER = ROOT / "scripts" / "pg-test-server"
TASKS = 12


@pytest.fixture
def own_pg() -> Iterator[tuple[Path, str]]:
    if shutil.which("runuser") is None and os.geteuid() == 0:
        pytest.fail("needs runuser (util-linux) to start PostgreSQL as its own user")
    folder = Path(tempfile.mkdtemp(prefix="sy-pg-"))
    folder.chmod(0o755)
    port = "55601"
    url = subprocess.run(["bash", str(PG_SERVER), "start", str(folder / "pg"), port], capture_output=True,
                         text=True, check=True, timeout=120).stdout.strip()
    try:
        yield folder, url
    finally:
        subprocess.run(["bash", str(PG_SERVER), "stop", str(folder / "pg")], capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


def _swarm(folder: Path, url: str) -> Path:
    lenses = "".join(f'[[tasks.lenses]]\ntitle = "lens {i}"\nprompt = "Look at lens {i}."\n' for i in range(TASKS))
    path = folder / "swarm.toml"
    path.write_text(f"""
[goal]
objective = "Should a small team bet on on-device speech models?"
budget_usd = "1"
call_cap = 400
deadline_s = 600
{lenses}
[policy]
kind = "team"
[workers]
count = {TASKS}
concurrency = 2
exec_timeout_s = 120
max_steps = 3
model = "sim-worker"
[lead]
model = "sim-lead"
[providers.sim]
kind = "simulated"
models = ["sim-worker", "sim-lead"]
[run]
runs_dir = "{folder / 'runs'}"
store = "{url}"
""")
    return path


def _findings(url: str) -> int:
    try:
        with psycopg.connect(url, connect_timeout=5) as conn:
            row = conn.execute("SELECT count(*) FROM findings").fetchone()
            return int(row[0]) if row else 0
    except psycopg.Error:
        return 0  # not there yet (no schema), or the server is restarting


def test_a_run_survives_a_postgres_restart(own_pg: tuple[Path, str]) -> None:
    folder, url = own_pg
    swarm = _swarm(folder, url)
    (folder / "tmp").mkdir()  # the run's own temp folder, so the machines root there is the run's alone
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           "HOME": str(folder), "LANG": "C.UTF-8", "TMPDIR": str(folder / "tmp")}
    watch = MachineWatch(machines_root(folder / "tmp"))
    runner = subprocess.Popen([sys.executable, "-m", "swarmyard.cli", "run", str(swarm), "--json"], cwd=folder,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    restarted = threading.Event()
    pause = threading.Event()
    try:
        while runner.poll() is None and not restarted.is_set():
            if _findings(url) >= 2:  # mid-run: findings written, tasks still open
                for step in ("stop", "start"):
                    subprocess.run(["bash", str(PG_SERVER), step, str(folder / "pg"), "55601"], check=True,
                                   capture_output=True, timeout=120)
                restarted.set()
            pause.wait(0.05)  # a poll of the store, not a wait for a race to end
        out, err = runner.communicate(timeout=600)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert restarted.is_set(), f"the run ended before it wrote two findings: {err[-4000:]}"
    if LEAD_NO_RESULT in err:
        assert_simulated_lead_ended(runner.returncode, err)  # it rode out the restart to its lead's end
    else:
        # A transaction in flight when the server went down fails (the server ended it; whether a commit
        # landed is the server's to say): the run stops with a one-line error, and its resume must complete it
        # with nothing lost. The error's words are psycopg's and depend on the moment: "AdminShutdown",
        # "terminating connection", "server closed the connection unexpectedly", or a call that then found
        # its machine gone.
        assert runner.returncode != 0 and re.search(r"^error \(\w+\): ", err, re.MULTILINE), err[-4000:]
        run_id = next((folder / "runs").iterdir()).name
        resumed = subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm), "--resume", run_id,
                                  "--json"], cwd=folder, env=env, capture_output=True, text=True, timeout=600)
        assert_simulated_lead_ended(resumed.returncode, resumed.stderr)
        out = resumed.stdout
        err += "\n--- the resume ---\n" + resumed.stderr
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["leftover_holds"] == 0, err[-6000:]
    with psycopg.connect(url) as conn:
        states: dict[str, int] = dict(conn.execute("SELECT state, count(*) FROM tasks GROUP BY state").fetchall())
        without = conn.execute("SELECT count(*) FROM tasks t WHERE NOT EXISTS "
                               "(SELECT 1 FROM findings f WHERE f.task_id = t.id)").fetchone()
    assert states.get("done") == TASKS + 1 and set(states) == {"done"}, states  # the lenses and the lead
    assert without is not None and without[0] == 0  # every task has its finding
    # each task done once, no token reused or stale write taken, every hold closed, the envelopes exact,
    # no machine left, the audit log and tables verified (tests/invariants.py)
    run_dir = next((folder / "runs").iterdir())
    facts = check_run(url, run_dir, machines=machines_root(folder / "tmp"), exclusive=True, owners=[runner.pid],
                      seen=watch.stop(), env=env)
    assert facts.events["task.completed"] == TASKS + 1

