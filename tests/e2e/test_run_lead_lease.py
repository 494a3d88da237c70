"""``swarmyard run`` with a lease short beside the work: a worker or lead whose every step (one model call) is far
shorter than its lease keeps its claim to the end, and so does a worker whose command runs longer than its lease
(within the command's timeout).

The built-in agent renews its claim every quarter of the lease while a model call is in flight. It measured that
quarter from each call's start, and each call ended its renewer: a lead asking ten 1.5 s questions on a 15 s lease
(a heartbeat every 3.75 s) never renewed, lost its claim at its last step (``lease_expired``) and was retried three
times until its task failed. The interval now counts from the last renewal, across calls.

The run is on the simulated provider, every answer 1.5 s long, with a 12 s lease (a heartbeat every 3 s): a
worker's or the lead's calls together take longer than the lease, each call alone far less. What is checked is in
the run's store: every task claimed once and done, no event naming ``lease_expired``, and each renewal of a claim
made before the lease it renewed ran out. A command was kept by nothing at all: a worker's 8 s command on a 3 s
lease lost its claim (``lease_expired`` at its next step); the claim is now kept while a tool runs too.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections import defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from rigs.outcomes import assert_simulated_lead_ended
from rigs.scripted import tool_call
from rigs.swarm_files import scripted_run, simulated_swarm

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

#: The lease: shorter than a worker's three steps or the lead's ten calls (1.5 s each), four times its heartbeat.
LEASE_S = 12


def _run(folder: Path, swarm: Path) -> tuple[subprocess.CompletedProcess[str], list[tuple[str, dict[str, Any]]]]:
    """``swarmyard run`` in ``folder``, and the run's events (kind, body) in order."""
    (folder / "tmp").mkdir(exist_ok=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8",
           "TMPDIR": str(folder / "tmp")}
    done = subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm), "--json"], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=900, check=False)
    (run_dir,) = (folder / "runs").iterdir()
    with sqlite3.connect(f"file:{run_dir / 'store.db'}?mode=ro", uri=True) as db:
        events = [(kind, json.loads(body)) for kind, body in
                  db.execute("SELECT kind, body FROM events ORDER BY id").fetchall()]
    return done, events


def _claims_kept(events: list[tuple[str, dict[str, Any]]], tasks: int) -> dict[str, list[dict[str, Any]]]:
    """Each task's claim, renewals and completion, checked: claimed once, done, never lapsed; no lease_expired."""
    assert not [body for _, body in events if "lease_expired" in json.dumps(body)]
    assert not [kind for kind, _ in events if kind == "task.failed"]
    claims: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for kind, body in events:
        if kind in ("task.claimed", "task.renewed", "task.completed"):
            claims[body["task"]].append(body)
    assert len(claims) == tasks
    for task, seen in claims.items():
        assert [e["kind"] for e in seen].count("task.claimed") == 1, (task, seen)  # never lost and taken again
        assert seen[-1]["kind"] == "task.completed", (task, seen)
        # each renewal (and the completion) came while the claim it renewed was live: the lease never lapsed
        for before, after in pairwise(seen):
            assert after["at_ms"] <= before["expires_ms"], (task, before, after)
    return claims


def _task(events: list[tuple[str, dict[str, Any]]], title: str) -> str:
    (task,) = [body["task"] for kind, body in events if kind == "task.created" and body["title"] == title]
    return str(task)


def test_a_lead_whose_calls_are_each_shorter_than_its_lease_keeps_its_claim(short_tmp: Path) -> None:
    swarm = simulated_swarm(short_tmp, objective="Count things", budget_usd="5", call_cap=500, deadline_s=900,
                            lenses=[(f"lens {i}", f"Say one fact about {i}.") for i in range(2)],
                            workers={"count": 2, "concurrency": 2, "max_steps": 3, "lease_s": LEASE_S},
                            latency_s=1.5)
    done, events = _run(short_tmp, swarm)
    # the simulated lead's answers are no synthesis: the run ends as such a run does, its lead's task done
    assert_simulated_lead_ended(done.returncode, done.stderr)
    assert "lease_expired" not in done.stderr
    claims = _claims_kept(events, 3)
    # the lead's claim was renewed while it worked (its heartbeats), not only when it was taken (two renewals then)
    lead = claims[_task(events, "synthesis")]
    assert [e["kind"] for e in lead].count("task.renewed") > 2, lead


def test_a_worker_whose_command_outlasts_its_lease_keeps_its_claim(short_tmp: Path) -> None:
    swarm = scripted_run(short_tmp, {
        "scripted-worker": [tool_call("shell", command="sleep 8; echo slept"),
                            tool_call("submit_finding", title="finding 0", body="What lens 0 shows, in brief.")],
        "scripted-lead": [tool_call("submit_finding", title="synthesis", body="Go: the findings agree.")]},
        workers={"lease_s": 3, "max_steps": 4, "max_failures": 1})
    done, events = _run(short_tmp, swarm)
    assert done.returncode == 0, done.stderr[-3000:]
    claims = _claims_kept(events, 2)
    # renewed during the command (a heartbeat a second), beside the two when it was claimed and the finding's
    worker = claims[_task(events, "market")]
    assert [e["kind"] for e in worker].count("task.renewed") > 3, worker
