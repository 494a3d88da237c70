"""``swarmyard run``'s last progress line off a terminal says where the run ended, as the store has it.

A short run said one line at its start ("tasks 0/1 done, 0 calls, $0.000000 settled") and then, the lines being
at most one a second, nothing more: the last progress line a log kept said no call was made while the store held
every call and its spend. Through the console script on the scripted provider (process sandbox: the subject is
the terminal, not the machine), the last ``progress:`` line is compared with the goal's row read with sqlite3.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from rigs.scripted import tool_call
from rigs.swarm_files import scripted_swarm

pytestmark = [pytest.mark.slow]

SWARMYARD = Path(sys.executable).with_name("swarmyard")
LINE = re.compile(r"^progress: tasks (\d+)/(\d+) done(?:, (\d+) failed)?, (\d+) calls, \$(\d+\.\d+) settled"
                  r"(?: \+ \$(\d+\.\d+) held)?, \d+:\d\d elapsed", re.M)


def test_the_last_progress_line_says_the_stores_calls_and_spend_at_the_end(short_tmp: Path) -> None:
    swarm = scripted_swarm(short_tmp, extra="[providers.script.prices.scripted-worker]\n"
                           "input_usd_per_mtok = \"2\"\noutput_usd_per_mtok = \"8\"\n")
    # the process sandbox named by the swarm file, not by --sandbox: the run's own warning line is not printed then
    swarm.write_text(swarm.read_text().replace('sandbox = "local"', 'sandbox = "process"'))
    (short_tmp / "conf" / "replies").mkdir()
    (short_tmp / "conf" / "replies" / "answers.json").write_text(json.dumps({
        "scripted-worker": [tool_call("board_post", body="measured"),
                            tool_call("submit_finding", title="market", body="Large.", cite=["1"])],
        "scripted-lead": [tool_call("submit_finding", title="synthesis", body="Go.")]}))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8",
           "XDG_STATE_HOME": str(short_tmp / "state"), "SWARMYARD_STATE_DIR": str(short_tmp / "state")}
    done = subprocess.run([str(SWARMYARD), "run", str(swarm), "--no-witness"],
                          cwd=short_tmp, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = LINE.findall(done.stderr)
    assert lines, done.stderr
    [run_dir] = (short_tmp / "runs").iterdir()
    db = sqlite3.connect(run_dir / "store.db")
    (calls, settled, reserved), = db.execute("SELECT calls, settled, reserved FROM goals").fetchall()
    db.close()
    assert calls >= 2 and settled > 0  # the worker's calls and the lead's, all priced
    said_done, total, _failed, said_calls, said_settled, said_held = lines[-1]
    assert int(said_calls) == calls, done.stderr
    assert round(float(said_settled) * 1_000_000) == settled, done.stderr
    assert round(float(said_held or "0") * 1_000_000) == reserved == 0, done.stderr
    assert said_done == total, done.stderr  # every task the line counts was done when the run ended
    # the line comes before the run's table, and is the last of its kind
    assert done.stderr.rindex("progress: ") < done.stderr.index("model calls")
    # the process sandbox is said to be no isolation in a line, not in Python's rendering of a warning (the file,
    # line and source of the warnings.warn call were printed for every machine)
    assert "gives NO isolation" in done.stderr
    assert not re.search(r"\.py:\d+: \w*Warning", done.stderr), done.stderr
    assert "Traceback" not in done.stderr
