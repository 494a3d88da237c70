"""The built-in agent never asks again for a call whose answer was lost after it left.

Through the console script: ``swarmyard run`` on a swarm file whose worker model is served by a loopback
upstream (the only test double: it stands in for a paid provider) that reads the request and drops the
connection without an answer. The broker marks that hold ``unknown`` and answers 502 ``upstream_unknown`` with
``x-should-retry: false``; the agent (which asks again after a failure in passing) must take that as final:
with one try allowed, the upstream sees exactly one worker request, and the store holds exactly one worker
reservation, ``unknown``.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rigs.swarm_files import upstream_swarm
from rigs.upstream import Answer, RawUpstream, completion_calling

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]


def _drop_the_workers_calls(body: dict[str, Any]) -> Answer:
    """A worker's request is dropped unanswered, the lead's gets a synthesis."""
    if body["model"] != "up-lead":
        return None
    return b"200 OK", completion_calling("up-lead", "submit_finding", {
        "title": "synthesis", "body": "The worker's call was lost and not repeated."})


@pytest.fixture
def upstream() -> Iterator[RawUpstream]:
    server = RawUpstream(_drop_the_workers_calls)
    yield server
    server.close()


def test_a_call_lost_after_it_left_is_not_asked_again(short_tmp: Path, upstream: RawUpstream) -> None:
    swarm = upstream_swarm(short_tmp, f"http://127.0.0.1:{upstream.port}/v1", objective="Say one thing.", lens=("one", "Say one thing."),
                           workers={"max_steps": 4, "max_failures": 1})
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8"}
    done = subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm)], cwd=short_tmp, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # one worker request reached the upstream: the agent did not ask again, and the broker did not either
    assert upstream.posts["up-worker"] == 1, upstream.posts
    [run_dir] = (short_tmp / "runs").iterdir()
    with sqlite3.connect(run_dir / "store.db") as db:
        rows = db.execute("SELECT model, state FROM reservations ORDER BY created_at").fetchall()
    worker_rows = [state for model, state in rows if model == "up-worker"]
    assert worker_rows == ["unknown"], rows  # one hold, unknown; no second hold
    [worker_log] = [p.read_text() for p in (run_dir / "agents").glob("worker-0-*.log")]
    assert worker_log.count('chat/completions "HTTP/1.1 502') == 1, worker_log[-2000:]
    assert "asking again" not in worker_log
    # it stopped on that error without a placeholder finding: its one try failed, and so did its task
    assert "stopped on a model error" in worker_log
    with sqlite3.connect(run_dir / "store.db") as db:
        [(state,)] = db.execute("SELECT state FROM tasks WHERE title = 'one'").fetchall()
    assert state == "failed"
