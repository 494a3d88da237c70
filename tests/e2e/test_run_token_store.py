"""A worker that prints its own capability token into its post, its artifact and its finding: the plane takes the
token out of what the worker submits, so it reaches neither the store nor anything made from it.

Through the console script on the scripted provider (process sandbox, where the agent's environment is readable
from its shell): the worker reads its token from ``/proc``, then posts it, submits it as an attempt and writes it
into its finding's title and body. Afterwards no file of the run folder holds a token (``store.db`` and its WAL,
the artifacts, ``report.html``, ``report.md``, the trajectories, the messages), and neither does any answer of
the finished run's dashboard (``swarmyard ui``, over real HTTP: its goals, its state and every worker's
trajectory); where each token stood, the store keeps ``[capability token]``.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from rigs.scripted import tool_call
from rigs.swarm_files import scripted_run

pytestmark = [pytest.mark.slow]

SWARMYARD = Path(sys.executable).with_name("swarmyard")
TOKEN = re.compile(rb"sy1\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{20,}")
MARKER = "[capability token]"
# the agent's own environment (the shell's parent), as its shell can read it; not every process's on the host:
# another run's token there is none of this plane's
PRINT_TOKEN = "tr '\\0' '\\n' < /proc/$PPID/environ | grep '^SWARMYARD_TOKEN='"


def _leaks(folder: Path, skip: set[Path]) -> list[str]:
    """The files under ``folder`` that hold a token."""
    return [str(p.relative_to(folder)) for p in sorted(folder.rglob("*"))
            if p.is_file() and p not in skip and TOKEN.search(p.read_bytes())]


def test_a_token_a_worker_submits_is_in_no_store_report_or_dashboard_answer(short_tmp: Path) -> None:
    shell = tool_call("shell", command=PRINT_TOKEN)
    swarm = scripted_run(short_tmp, {
        "scripted-worker": [shell, tool_call("board_post", body="saw {{last_message}}"),
                            shell, tool_call("submit_artifact", content="{{last_message}}"),
                            shell, tool_call("submit_finding", title="env {{last_message}}",
                                             body="env: {{last_message}}", cite=["1"])],
        "scripted-lead": [tool_call("submit_finding", title="synthesis", body="Go.")]},
        workers={"max_steps": 8, "exec_timeout_s": 120})
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8",
           "XDG_STATE_HOME": str(short_tmp / "state"), "SWARMYARD_STATE_DIR": str(short_tmp / "state")}
    done = subprocess.run([str(SWARMYARD), "run", str(swarm), "--sandbox", "process", "--no-witness"],
                          cwd=short_tmp, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [run_dir] = (short_tmp / "runs").iterdir()

    # the worker did submit its token, everywhere it could: the store holds the marker where each stood
    with sqlite3.connect(f"file:{run_dir / 'store.db'}?mode=ro", uri=True) as db:
        posts = [body for (body,) in db.execute("SELECT body FROM posts")]
        findings = db.execute("SELECT title, body FROM findings").fetchall()
    said = f"SWARMYARD_TOKEN={MARKER}"
    assert any(body.startswith("saw ") and said in body for body in posts), posts
    # the built-in agent cuts a title at 200 characters, short of a token's MAC: what is left of one there is no token
    assert any(title.startswith("env ") and "SWARMYARD_TOKEN=" in title and not TOKEN.search(title.encode())
               and said in body for title, body in findings), findings
    assert (run_dir / "report.html").is_file() and (run_dir / "report.md").is_file()
    assert said in (run_dir / "report.md").read_text()

    viewer = subprocess.Popen([str(SWARMYARD), "ui", str(run_dir)], cwd=short_tmp, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert viewer.stderr is not None
        line = ""
        while "its dashboard on " not in line:
            line = viewer.stderr.readline()
            assert line, "swarmyard ui ended before it served"
        served = re.search(r"(http://\S+)/ui\b.*operator token in (.+?)\)", line)
        assert served is not None, line
        base, token_file = served[1], Path(served[2])
        operator = token_file.read_text().strip()
        with httpx.Client(base_url=base, headers={"authorization": f"Bearer {operator}"}, timeout=30) as http:
            goals = http.get("/ui/api/goals")
            assert goals.status_code == 200, goals.text
            answers = [goals]
            for goal in goals.json()["goals"]:
                state = http.get("/ui/api/state", params={"goal": goal["id"]})
                assert state.status_code == 200, state.text
                answers.append(state)
                workers = [w["id"] for w in state.json()["workers"]]
                assert len(workers) >= 2  # the worker and the lead
                answers += [http.get(f"/ui/api/trajectory/{worker}") for worker in workers]
        assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200]
        shown = b"".join(a.content for a in answers).replace(operator.encode(), b"")
        assert not TOKEN.search(shown), TOKEN.search(shown)
        assert MARKER.encode() in shown  # the dashboard shows the finding and post, with the marker
    finally:
        viewer.terminate()
        viewer.wait(60)

    # no file of the run keeps a token (the operator token the viewer was given is its own file)
    assert (run_dir / "agents" / "messages").is_dir() and list((run_dir / "agents").glob("*.jsonl"))
    assert _leaks(run_dir, {token_file}) == []
