"""A worker whose every model call fails is a failed try, not a finished task.

Through the console script, in real bubblewrap machines: ``swarmyard run`` on a swarm file whose worker model
is served by a loopback upstream (the only test double: it stands in for a paid provider) that drops every
worker call unanswered (the broker answers 502 ``upstream_unknown``) or answers each with a 401. The built-in
worker submits no placeholder finding: it exits non-zero saying it stopped on a model error, the coordinator
counts a failed try, the task is failed after ``max_failures`` tries with that error, the report names it, and
the run goes on to its lead and ends.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rigs.swarm_files import upstream_swarm
from rigs.upstream import Answer, RawUpstream, completion_calling

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

SYNTHESIS = "No worker could reach its model."


def _failing_upstream(mode: str) -> RawUpstream:
    """A worker's request is dropped (``drop``) or answered 401 (``401``), the lead's gets a synthesis."""

    def behaviour(body: dict[str, Any]) -> Answer:
        if body["model"] == "up-lead":
            return b"200 OK", completion_calling("up-lead", "submit_finding",
                                                 {"title": "synthesis", "body": SYNTHESIS})
        if mode == "drop":
            return None
        return b"401 Unauthorized", {"error": {"message": "Incorrect API key provided",
                                               "type": "invalid_request_error", "code": "invalid_api_key"}}

    return RawUpstream(behaviour)


@pytest.mark.parametrize(("mode", "code"), [("drop", "upstream_unknown"), ("401", "provider_error")])
def test_a_worker_whose_every_call_fails_fails_its_task_after_max_failures(short_tmp: Path, mode: str,
                                                                          code: str) -> None:
    upstream = _failing_upstream(mode)
    swarm = upstream_swarm(short_tmp, f"http://127.0.0.1:{upstream.port}/v1", objective="Should a small team build a speech app?",
                           lens=("market", "Size the market."),
                           workers={"max_steps": 4, "max_failures": 2, "retry_backoff_s": 0})
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8"}
    try:
        done = subprocess.run([str(Path(sys.executable).with_name("swarmyard")), "run", str(swarm)],
                              cwd=short_tmp, env=env, capture_output=True, text=True, timeout=600)
    finally:
        upstream.close()
    assert done.returncode == 0, done.stderr[-3000:]  # the run went on to its lead and ended
    answer, note = done.stdout.strip().split("\n\n", 1)
    assert answer == SYNTHESIS
    assert note.startswith("1 of 1 tasks reached no result") and f"({code})" in note, note
    [run_dir] = (short_tmp / "runs").iterdir()
    with sqlite3.connect(run_dir / "store.db") as db:
        tasks = {title: (state, attempts, result)
                 for title, state, attempts, result in db.execute("SELECT title, state, attempts, result FROM tasks")}
        findings = [title for (title,) in db.execute("SELECT title FROM findings")]
    state, attempts, why = tasks["market"]
    assert (state, attempts) == ("failed", 2), tasks
    assert why is not None and why.startswith("2 tries failed the same way: exit 1:"), why
    assert "stopped on a model error at step 1 of 4, before any work" in why and f"({code})" in why, why
    assert findings == ["synthesis"]  # no placeholder finding from the worker
    assert upstream.posts["up-worker"] >= 2, upstream.posts
    logs = [p.read_text() for p in (run_dir / "agents").glob("worker-0-*.log")]
    assert len(logs) == 2 and all("stopped on a model error" in text for text in logs)
    assert "No result was reached" not in "".join(logs)
    report = (run_dir / "report.md").read_text()
    assert "## Failed tasks" in report and "| market |" in report
    assert "stopped on a model error" in report
