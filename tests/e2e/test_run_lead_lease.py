"""``swarmyard run`` with a lease short beside the work: a worker or lead whose every step (one model call) is far
shorter than its lease keeps its claim to the end.

The built-in agent renews its claim every quarter of the lease while a model call is in flight. It measured that
quarter from each call's start, and each call ended its renewer: a lead asking ten 1.5 s questions on a 15 s lease
(a heartbeat every 3.75 s) never renewed, lost its claim at its last step (``lease_expired``) and was retried three
times until its task failed. The interval now counts from the last renewal, across calls.

The run is on the simulated provider, every answer 1.5 s long, with a 12 s lease (a heartbeat every 3 s): a
worker's or the lead's calls together take longer than the lease, each call alone far less. What is checked is in
the run's store: every task claimed once and done, no event naming ``lease_expired``, and each renewal of a claim
made before the lease it renewed ran out.
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

import pytest

from rigs.outcomes import assert_simulated_lead_ended
from rigs.swarm_files import simulated_swarm

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

#: The lease: shorter than a worker's three steps or the lead's ten calls (1.5 s each), four times its heartbeat.
LEASE_S = 12


def test_a_lead_whose_calls_are_each_shorter_than_its_lease_keeps_its_claim(short_tmp: Path) -> None:
    swarm = simulated_swarm(short_tmp, objective="Count things", budget_usd="5", call_cap=500, deadline_s=900,
                            lenses=[(f"lens {i}", f"Say one fact about {i}.") for i in range(2)],
                            workers={"count": 2, "concurrency": 2, "max_steps": 3, "lease_s": LEASE_S},
                            latency_s=1.5)
    (short_tmp / "tmp").mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8",
           "TMPDIR": str(short_tmp / "tmp")}
    done = subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm), "--json"], cwd=short_tmp,
                          env=env, capture_output=True, text=True, timeout=900, check=False)
    # the simulated lead's answers are no synthesis: the run ends as such a run does, its lead's task done
    assert_simulated_lead_ended(done.returncode, done.stderr)
    assert "lease_expired" not in done.stderr
    (run_dir,) = (short_tmp / "runs").iterdir()
    with sqlite3.connect(f"file:{run_dir / 'store.db'}?mode=ro", uri=True) as db:
        events = [(kind, json.loads(body)) for kind, body in
                  db.execute("SELECT kind, body FROM events ORDER BY id").fetchall()]
        tasks = dict(db.execute("SELECT title, state FROM tasks").fetchall())
    assert tasks == {"lens 0": "done", "lens 1": "done", "synthesis": "done"}
    assert not [body for _, body in events if "lease_expired" in json.dumps(body)]
    assert not [kind for kind, _ in events if kind in ("task.failed", "task.expired")]
    claims: dict[str, list[dict[str, int]]] = defaultdict(list)
    for kind, body in events:
        if kind in ("task.claimed", "task.renewed", "task.completed"):
            claims[body["task"]].append(body)
    assert len(claims) == 3
    for task, seen in claims.items():
        assert [e["kind"] for e in seen].count("task.claimed") == 1, (task, seen)  # never lost and taken again
        assert seen[-1]["kind"] == "task.completed", (task, seen)
        # each renewal (and the completion) came while the claim it renewed was live: the lease never lapsed
        for before, after in pairwise(seen):
            assert after["at_ms"] <= before["expires_ms"], (task, before, after)
    # the lead's claim was renewed while it worked (its heartbeats), not only when it was taken (two renewals then)
    (lead,) = [body["task"] for kind, body in events if kind == "task.created" and body["title"] == "synthesis"]
    assert [e["kind"] for e in claims[lead]].count("task.renewed") > 2, claims[lead]
