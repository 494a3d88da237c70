"""``swarmyard run`` on the scripted provider, whose replies come from a file the swarm file names.

Through the console script, in real bubblewrap machines: a replies file drives a whole run to its synthesis;
an agent that fails at once, every time (Claude Code on a model whose window cannot hold its first request,
the way a new user met it) is tried three times, its task is failed with its error and the run ends; a lead
with no reply left is tried three times and the run exits 1 with a report that says so; a scripted provider
with no replies file, or a bad one, is refused before anything exists.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rigs.scripted import tool_call as _tool
from rigs.swarm_files import scripted_swarm

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

SYNTHESIS = "Go: the scout found a market."


def _swarm(folder: Path, *, agent: str = "builtin", replies: str | None = "replies/answers.json",
           extra: str = "") -> Path:
    """A swarm file in ``folder/conf`` (so a relative replies path is not the working folder's)."""
    return scripted_swarm(folder, agent=agent, replies=replies, extra=extra)


def _replies(folder: Path, replies: dict[str, Any]) -> None:
    (folder / "conf" / "replies").mkdir(parents=True, exist_ok=True)
    (folder / "conf" / "replies" / "answers.json").write_text(json.dumps(replies))


def _run(folder: Path, swarm: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    return subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)


def _tasks(folder: Path) -> dict[str, tuple[str, int, str | None]]:
    [run_dir] = (folder / "runs").iterdir()
    with sqlite3.connect(run_dir / "store.db") as db:
        rows = db.execute("SELECT title, state, attempts, result FROM tasks").fetchall()
    return {str(title): (str(state), int(attempts), result) for title, state, attempts, result in rows}


def test_a_replies_file_drives_a_run_to_its_synthesis(short_tmp: Path) -> None:
    swarm = _swarm(short_tmp)
    _replies(short_tmp, {
        "scripted-worker": [_tool("board_post", body="the market is large"),
                            _tool("submit_finding", title="market", body="Large and growing.", cite=["1"])],
        "scripted-lead": [_tool("submit_finding", title="synthesis", body=SYNTHESIS)],
    })
    done = _run(short_tmp, swarm)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == SYNTHESIS
    tasks = _tasks(short_tmp)
    assert {title: state for title, (state, _, _) in tasks.items()} == {"market": "done", "synthesis": "done"}
    [run_dir] = (short_tmp / "runs").iterdir()
    report = (run_dir / "report.md").read_text()
    assert "Large and growing." in report and SYNTHESIS in report and "Failed tasks" not in report


def test_an_agent_that_fails_at_once_every_time_is_tried_three_times(short_tmp: Path) -> None:
    assert shutil.which("claude"), "Claude Code is not installed: scripts/test installs it from the npm registry"
    # its first request is tens of thousands of tokens; this route's window holds 1,000
    swarm = _swarm(short_tmp, agent="claude", extra="[providers.script.prices.scripted-worker]\n"
                                                     "context_tokens = 1000\n")
    _replies(short_tmp, {"scripted-lead": [_tool("submit_finding", title="synthesis", body=SYNTHESIS)]})
    done = _run(short_tmp, swarm)
    assert done.returncode == 0, done.stderr[-3000:]  # the run carried on to its lead and ended
    # the synthesis, then the store's line on the task that reached nothing and why
    answer, note = done.stdout.strip().split("\n\n", 1)
    assert answer == SYNTHESIS
    assert note.startswith("1 of 1 tasks reached no result") and "'market': it failed: 3 tries" in note, note
    state, attempts, why = _tasks(short_tmp)["market"]
    assert (state, attempts) == ("failed", 3)
    assert why is not None and why.startswith("3 tries failed the same way: exit 1:") and "context window" in why
    [run_dir] = (short_tmp / "runs").iterdir()
    # a log per try (beside each, Claude Code's own transcript)
    assert len([p for p in (run_dir / "agents").glob("worker-0-*.log")]) == 3
    assert "task 'market'" in done.stderr and "failed: 3 tries failed the same way" in done.stderr
    report = (run_dir / "report.md").read_text()
    assert "## Failed tasks" in report and "| market |" in report and "context window" in report


def test_a_lead_with_no_reply_left_ends_the_run_with_exit_1_and_a_report(short_tmp: Path) -> None:
    swarm = _swarm(short_tmp)
    _replies(short_tmp, {"scripted-worker": [_tool("submit_finding", title="market", body="Large.")]})
    done = _run(short_tmp, swarm)
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stdout.strip() == "(no synthesis was written)"
    assert "ended without a synthesis" in done.stderr
    tasks = _tasks(short_tmp)
    assert tasks["market"][0] == "done"
    state, attempts, why = tasks["synthesis"]
    assert (state, attempts) == ("failed", 3) and why is not None and "no scripted reply left" in why
    [run_dir] = (short_tmp / "runs").iterdir()
    report = (run_dir / "report.md").read_text()
    assert "_No synthesis was written._" in report and "| synthesis |" in report


@pytest.mark.parametrize(("replies", "content", "words"), [
    (None, None, "providers.script.replies: a scripted provider needs replies = FILE"),
    ("replies/answers.json", None, "replies file"),
    ("replies/answers.json", '{"scripted-lead": [{"say": "a", "fail": "after_send"}]}', "exactly one of"),
    ("replies/answers.json", '{"scripted-lead": [{"tool_calls": [{"name": "x"}], "usage": false}]}',
     "usage = false goes with say"),
    ("replies/answers.json", '{"scripted-lead": [{"tool_calls": [{"nme": "x"}]}]}', "tool_calls.0.name: Field required"),
    ("replies/answers.json", "{not json", "not valid JSON"),
])
def test_a_scripted_provider_without_usable_replies_is_refused_before_anything(
        short_tmp: Path, replies: str | None, content: str | None, words: str) -> None:
    swarm = _swarm(short_tmp, replies=replies)
    if content is not None:
        (short_tmp / "conf" / "replies").mkdir()
        (short_tmp / "conf" / "replies" / "answers.json").write_text(content)
    done = _run(short_tmp, swarm)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "config_error" in lines[0] and words in lines[0], done.stderr
    assert not (short_tmp / "runs").exists()  # no run folder, no store, no goal
