"""A finished run's dashboard says what its store says after the run: a hold reconciled shows on the open page.

A run whose every upstream answer is lost ends with its holds ``unknown``; its dashboard (``swarmyard ui
RUN_FOLDER``) shows them in a banner with the ``swarmyard budget reconcile`` command. The operator runs that
command: the state route then said one hold fewer, but the page's stream (what the browser shows, on a reload
too) kept the state it built first for as long as the dashboard ran, since a finished run's state was built once.
Here a stream is held open while ``swarmyard budget reconcile --release`` settles one hold, and a new stream is
opened after it: both must say what the store says.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rigs.swarm_files import scripted_swarm

pytestmark = [
    pytest.mark.bwrap,
]

SWARMYARD = Path(sys.executable).with_name("swarmyard")


@pytest.fixture
def dropped_run() -> Iterator[tuple[Path, dict[str, str]]]:
    folder = Path(tempfile.mkdtemp(prefix="sy-urh-"))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    swarm = scripted_swarm(folder, agent="builtin", replies="replies.json")
    (folder / "conf" / "replies.json").write_text(json.dumps({
        "scripted-worker": [{"fail": "after_send"}] * 8, "scripted-lead": [{"fail": "after_send"}] * 8}))
    done = subprocess.run([str(SWARMYARD), "run", str(swarm)], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 1, done.stderr[-3000:]  # no synthesis: every answer was lost
    (run_dir,) = (folder / "runs").iterdir()
    yield run_dir, env
    shutil.rmtree(folder, ignore_errors=True)


def _states(response: httpx.Response) -> Iterator[dict[str, Any] | None]:
    """Each state event, and None for each keepalive (the stream sends one every 15 s when nothing changed)."""
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield json.loads(line.removeprefix("data: "))
        elif line.startswith(":"):
            yield None


def _next_state(states: Iterator[dict[str, Any] | None]) -> dict[str, Any]:
    return next(state for state in states if state is not None)


def test_a_hold_reconciled_after_the_run_shows_on_its_open_dashboard(
        dropped_run: tuple[Path, dict[str, str]]) -> None:
    run_dir, env = dropped_run
    store = run_dir / "store.db"
    with sqlite3.connect(store) as db:
        unknown = [row[0] for row in db.execute("SELECT id FROM reservations WHERE state = 'unknown' ORDER BY id")]
    db.close()
    assert len(unknown) >= 2
    goal = json.loads((run_dir / "run.json").read_text())["goal_id"]
    proc = subprocess.Popen([str(SWARMYARD), "ui", str(run_dir)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        found = re.search(r"(http://\S+/ui)\b.*operator token in (.+?)\)", line)
        assert found is not None, line
        url, token = found[1], Path(found[2]).read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}
        timeout = httpx.Timeout(60, read=60)  # a state, or a keepalive every 15 s: a read this long is a hang
        with httpx.stream("GET", f"{url}/events", params={"goal": goal}, headers=headers, timeout=timeout) as open_page:
            states = _states(open_page)
            first = _next_state(states)
            assert first["run"]["finished"] and first["holds"]["unknown"] == len(unknown)
            assert first["holds"]["open"] == len(unknown)

            settled = subprocess.run([str(SWARMYARD), "budget", "reconcile", unknown[0], "--release", "--store",
                                      f"sqlite:///{store}"], env=env, capture_output=True, text=True, timeout=120,
                                     check=False)
            assert settled.returncode == 0, settled.stderr[-2000:]

            deadline = time.monotonic() + 120
            latest: dict[str, Any] | None = first
            while time.monotonic() < deadline:  # a state, or a keepalive 15 s apart
                latest = next(states)
                if latest is not None and latest["holds"]["open"] != len(unknown):
                    break
            assert latest is not None, "no state came after the reconcile, only keepalives"
            assert latest["holds"]["open"] == len(unknown) - 1
            assert unknown[0] not in latest["holds"]["ids"]
        with httpx.stream("GET", f"{url}/events", params={"goal": goal}, headers=headers, timeout=timeout) as reload:
            again = _next_state(_states(reload))
        assert again["holds"]["open"] == len(unknown) - 1 and again["holds"]["unknown"] == len(unknown) - 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
