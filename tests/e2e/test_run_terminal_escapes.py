"""A worker's or a model's terminal escape sequences never reach the operator's terminal through ``swarmyard run``,
nor its ``report.md`` as they are.

Through ``swarmyard run`` (a subprocess, not a terminal) on the scripted provider, in real bubblewrap machines. A
worker's shell command writes ``ESC[2J ESC]0;pwned BEL ESC[32mALL CLEAR`` to its agent's stderr and kills the
agent: that stderr is why the task failed, and reaches two warning log lines, the progress line's errors and the
``task ... failed`` line. A lead whose answer is a no-result placeholder holding ESC leaves no synthesis: its words
are the ``ended without a synthesis`` line. A worker's finding whose title and body hold ESC, and a lead whose
synthesis does, go to the report's heading, quoted body and the synthesis printed on stdout. Every control
character is printed as U+FFFD (``swarmyard.controls.shown``), the words around it as they are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rigs.scripted import tool_call

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

FORGED = "\x1b[2J\x1b]0;pwned\x07\x1b[32mALL CLEAR\x1b[0m"
#: as ``shown`` prints it
SHOWN = "\ufffd[2J\ufffd]0;pwned\ufffd\ufffd[32mALL CLEAR\ufffd[0m"

#: in the worker's machine: the agent's stderr gets FORGED, then the agent is killed (the shell itself is spared)
_KILL = ("for p in /proc/[0-9]*; do [ \"${p#/proc/}\" = \"$$\" ] && continue; "
         "if tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q 'swarmyard[.]agents'; then "
         "printf 'agent error (x): \\033[2J\\033]0;pwned\\007\\033[32mALL CLEAR\\033[0m\\n' > $p/fd/2; "
         "kill -9 ${p#/proc/}; fi; done; echo done")


def _run(folder: Path, replies: dict[str, Any]) -> tuple[subprocess.CompletedProcess[str], str]:
    """``swarmyard run`` of one lens for one worker (one try) and a lead, both scripted; the run and its report.md."""
    (folder / "replies.json").write_text(json.dumps(replies))
    swarm = folder / "swarm.toml"
    swarm.write_text(f"""
[goal]
objective = "Is the build green?"
budget_usd = "1"
call_cap = 30
deadline_s = 300
max_depth = 1
[[tasks.lenses]]
title = "a"
prompt = "Look at the build."
[policy]
kind = "team"
[workers]
agent = "builtin"
count = 1
concurrency = 1
exec_timeout_s = 60
max_steps = 3
model = "w"
max_failures = 1
retry_backoff_s = 0.2
[lead]
agent = "builtin"
model = "lead"
max_steps = 2
[providers.s]
kind = "scripted"
models = ["w", "lead"]
replies = "replies.json"
[run]
runs_dir = "{folder / 'runs'}"
sandbox = "local"
""")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    done = subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    [run_dir] = (folder / "runs").iterdir()
    # report.html is read as a file in terminals too (its HTML escaping left ESC as it was)
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "\x1b" not in page, page[-3000:]
    return done, (run_dir / "report.md").read_text(encoding="utf-8")


def test_an_agents_stderr_and_the_leads_no_result_print_no_escape_sequence(short_tmp: Path) -> None:
    done, report = _run(short_tmp, {
        "w": [tool_call("shell", command=_KILL) for _ in range(4)],
        "lead": [tool_call("submit_finding", title="lead", body=f"No result was reached for 'x': {FORGED}")
                 for _ in range(3)],
    })
    assert done.returncode == 1, done.stderr[-3000:]  # no synthesis
    assert "\x1b" not in done.stdout and "\x1b" not in done.stderr, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    # the agent's stderr is why the task failed: in the log lines and the task's line, its words shown
    warnings = [line for line in lines if line.startswith("WARNING ")]
    assert warnings and all(SHOWN in line for line in warnings), warnings
    [failed] = [line for line in lines if line.startswith("task 'a' (")]
    assert failed.endswith(f"failed: 1 tries failed the same way: exit 137: agent error (x): {SHOWN}"), failed
    [ended] = [line for line in lines if " ended without a synthesis: " in line]
    assert f"the lead reached no result: {SHOWN}" in ended, ended
    assert done.stdout.strip() == "(no synthesis was written)"
    # report.md: the failed task's row and the lead's quoted placeholder
    assert "\x1b" not in report, report
    assert f"> No result was reached for 'x': {SHOWN}" in report
    assert f"agent error (x): {SHOWN} |" in report


def test_a_findings_title_and_body_and_the_synthesis_print_no_escape_sequence(short_tmp: Path) -> None:
    done, report = _run(short_tmp, {
        "w": [tool_call("submit_finding", title=f"green {FORGED}", body=f"The build is {FORGED} now.")
              for _ in range(3)],
        # not the finding's words: the lead's own (a copy of the findings is refused)
        "lead": [tool_call("submit_finding", title="synthesis", body="Yes, merge it today. \x1b[31mRED\x1b]8;;x\x07")
                 for _ in range(3)],
    })
    assert done.returncode == 0, done.stderr[-3000:]
    assert "\x1b" not in done.stdout and "\x1b" not in done.stderr, done.stderr[-3000:]
    said = "Yes, merge it today. \ufffd[31mRED\ufffd]8;;x\ufffd"
    assert done.stdout.startswith(said), done.stdout
    assert "\x1b" not in report, report
    assert f"### green {SHOWN}" in report
    assert f"> The build is {SHOWN} now." in report
    assert f"> {said}" in report


def test_a_findings_title_holding_rich_markup_is_shown_as_written_by_runs_show(short_tmp: Path) -> None:
    # A str cell was read as rich markup: '[/x]' ended runs show with 'error (internal): MarkupError', and a
    # '[link=...]' became an OSC 8 link on a terminal
    title = "fix [/x] now [link=https://evil.example/m]docs[/link]"
    done, _ = _run(short_tmp, {
        "w": [tool_call("submit_finding", title=title, body="The build is green now.") for _ in range(3)],
        "lead": [tool_call("submit_finding", title="synthesis", body="Yes, merge it today.") for _ in range(3)],
    })
    assert done.returncode == 0, done.stderr[-3000:]
    [run_dir] = (short_tmp / "runs").iterdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8",
           "COLUMNS": "400"}
    shown = subprocess.run([sys.executable, "-m", "swarmyard.cli", "runs", "show", run_dir.name,
                            "--runs-dir", str(short_tmp / "runs")], cwd=short_tmp, env=env, capture_output=True,
                           text=True, timeout=300, check=False)
    assert shown.returncode == 0, shown.stderr
    assert "[/x]" in shown.stdout and "[link=https://evil.example/m]" in shown.stdout, shown.stdout
