"""``swarmyard run``'s progress on stderr, through the console script on the scripted provider (process sandbox:
the subject is the terminal, not the machine): off a terminal, plain lines with the run's summary (tasks done of
all, calls, spend, elapsed) and no escape codes; with ``--quiet``, no progress at all; on a terminal (a pty), the
rich live view with the same summary line over the table."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rigs.scripted import tool_call
from rigs.swarm_files import scripted_swarm
from rigs.terminal import run_on_a_terminal

pytestmark = [pytest.mark.slow]

SWARMYARD = Path(sys.executable).with_name("swarmyard")
SUMMARY = re.compile(r"tasks \d+/\d+ done(, \d+ failed)?, \d+ calls, \$\d+\.\d+ settled( \+ \$\d+\.\d+ held)?, "
                     r"\d+:\d\d elapsed")


def _swarm(folder: Path) -> Path:
    path = scripted_swarm(folder)
    (folder / "conf" / "replies").mkdir()
    worker = [tool_call("shell", command="sleep 2; echo measured"), tool_call("board_post", body="measured"),
              tool_call("submit_finding", title="market", body="Large.", cite=["1"])]
    (folder / "conf" / "replies" / "answers.json").write_text(json.dumps({
        "scripted-worker": worker,
        "scripted-lead": [tool_call("submit_finding", title="synthesis", body="Go.")]}))
    return path


def _env(folder: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8",
            "XDG_STATE_HOME": str(folder / "state"), "SWARMYARD_STATE_DIR": str(folder / "state")}


def test_off_a_terminal_progress_is_plain_summary_lines_and_quiet_says_nothing(short_tmp: Path) -> None:
    swarm = _swarm(short_tmp)
    done = subprocess.run([str(SWARMYARD), "run", str(swarm), "--sandbox", "process", "--no-witness"],
                          cwd=short_tmp, env=_env(short_tmp), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "Go."
    progress = [line for line in done.stderr.splitlines() if line.startswith("progress: ")]
    assert progress and all(SUMMARY.search(line) for line in progress), done.stderr
    assert "\x1b[" not in done.stderr  # plain lines: no cursor moves, no colours
    assert re.search(r"^worker-0 submitted task=\S+ steps=\d+", done.stderr, re.M), done.stderr

    quiet = subprocess.run([str(SWARMYARD), "run", str(swarm), "--sandbox", "process", "--no-witness", "--quiet"],
                           cwd=short_tmp, env=_env(short_tmp), capture_output=True, text=True, timeout=600)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert quiet.stdout.strip() == "Go."
    assert "progress:" not in quiet.stderr and "worker-0 submitted" not in quiet.stderr
    assert not SUMMARY.search(quiet.stderr)


def test_on_a_terminal_progress_is_a_live_view_with_the_summary_line(short_tmp: Path) -> None:
    swarm = _swarm(short_tmp)
    env = {**_env(short_tmp), "TERM": "xterm-256color", "COLUMNS": "160", "LINES": "40"}
    code, out, seen = run_on_a_terminal([str(SWARMYARD), "run", str(swarm), "--sandbox", "process", "--no-witness"],
                                        cwd=short_tmp, env=env)
    assert code == 0, seen.decode("utf-8", "replace")[-3000:]
    assert out.decode().strip() == "Go."
    text = seen.decode("utf-8", "replace")
    assert "\x1b[" in text  # rich drew on the terminal
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert SUMMARY.search(plain), plain[-3000:]
    assert "last board post" in plain and "progress: " not in plain  # the table, not the plain lines
