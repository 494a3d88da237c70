"""``swarmyard run`` ends soon after its last event, however many workers it had.

After the run's last event (``run.closed``, once every machine is deleted) the process only checkpoints the audit
log and writes the report; the report's charts drew an artist per worker, step and model call, so the time after
the last event grew with the run (2.7 s of a 3.1 s tail at 120 workers on an idle host, far more on a busy one).
The test runs 200 workers on the simulated provider in real machines (25 at a time: what grows with the run in its
tail is the number of workers, machines, spans and calls, not how many ran at once, and CI hosts have two cores) and
compares the run's own last event time with the process's exit as the test saw it (its monotonic clock around the
subprocess, put on the wall clock the store's events use). The bound is on that tail alone, never on the run's
length.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigs.outcomes import assert_simulated_lead_ended
from rigs.swarm_files import simulated_swarm

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

SWARMYARD = Path(sys.executable).parent / "swarmyard"
WORKERS = 200
CONCURRENCY = 25
#: Seconds the process may take after the run's last event: checkpoint, report, exit. Not scaled by the run: the
#: issue's figure is 5 s (`bench swarm --compare` measures 2.0-2.1 s); a 2-core host running other tests beside it
#: took 5.3 s once, so the test allows 10 s, still far from the 10-107 s of a process that waits on its machines.
TAIL_S = 10.0


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-ex-"))  # the plane's socket lives in the run folder: keep it short
    (path / "tmp").mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _swarm(folder: Path) -> Path:
    return simulated_swarm(folder, objective="Count things", budget_usd="20", call_cap=4000, deadline_s=900,
                           lenses=[(f"lens {i}", f"Say one fact about {i}.") for i in range(WORKERS)],
                           workers={"count": WORKERS, "concurrency": CONCURRENCY, "max_steps": 2}, latency_s=0.5)


def test_a_run_of_many_workers_exits_soon_after_its_last_event(folder: Path) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8",
           "TMPDIR": str(folder / "tmp")}
    wall, began = time.time(), time.monotonic()
    done = subprocess.run([str(SWARMYARD), "run", str(_swarm(folder)), "--quiet"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=1800, check=False)
    exited = wall + (time.monotonic() - began)
    # a simulated lead reaches no result, and the run says so with exit 1: it still ends as any run does, which is
    # what is timed here
    assert_simulated_lead_ended(done.returncode, done.stderr)
    (run_dir,) = (folder / "runs").iterdir()
    with sqlite3.connect(f"file:{run_dir / 'store.db'}?mode=ro", uri=True) as db:
        kind, last = db.execute("SELECT kind, created_at FROM events ORDER BY id DESC LIMIT 1").fetchone()
        started = db.execute("SELECT count(*) FROM events WHERE kind = 'machine.created'").fetchone()[0]
    assert kind == "run.closed"
    assert started >= WORKERS  # every worker ran in a machine of its own (and the lead in one more)
    assert (run_dir / "report.html").is_file()
    tail = exited - last
    assert 0 <= tail <= TAIL_S, f"the process exited {tail:.1f} s after the run's last event"
