"""``swarmyard run --json`` with the ``groups`` policy when a group has more workers than there are tasks, through
the console script on the scripted provider: four workers in two groups (two formulations) and one task, so each
group's round holds two attempts at it and every worker works, each under its own claim, with model calls of its
own (read from the store). The run's figures say how often a group's best attempt after a broadcast built on
another group's findings (it cites them, or the broadcast) and how often it beat them (scored above them).

Every worker gets the same reply, whatever order the workers ask in, so the runs repeat:

- scored: each attempt is the worker's brief itself (``{{last_message}}``), and the test's evaluator bundle scores
  an attempt 1 plus 10 per score it quotes: a round-1 brief quotes none (1), a round-2 brief shows the broadcast
  with both groups' best scores (21); the agent's finding cites its attempts only;
- cited: one step, a finding citing posts 1 and 2 (the broadcast's copies on g0's and g1's boards): an agent
  keeps only the citations of posts it read, so a round-2 finding cites its own group's copy of the broadcast.
  One agent runs at a time here: a slot that has finished waits behind the others, so a group's second attempt
  still goes to its second worker.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from rigs.scripted import tool_call as _tool

pytestmark = [pytest.mark.slow]

SCORER = """import sys
from pathlib import Path
print(1 + 10 * Path(sys.argv[1]).read_text(errors="replace").count("(score "))
"""


def _bundle(folder: Path) -> None:
    (folder / "search").mkdir(parents=True)
    (folder / "holdout").mkdir()
    (folder / "search" / "note.txt").write_text("search\n")
    (folder / "holdout" / "note.txt").write_text("holdout\n")
    (folder / "score.py").write_text(SCORER)
    (folder / "evaluator.toml").write_text('name = "quoted-scores"\n[scoring]\nentry = "score.py"\n'
                                           'interpreter = "/usr/bin/python3"\n[limits]\ntimeout_s = 20\n'
                                           "max_artifact_bytes = 65536\n")


def _swarm(folder: Path, worker: list[dict[str, Any]], *, steps: int, scored: bool, concurrency: int) -> Path:
    conf = folder / "conf"
    conf.mkdir()
    if scored:
        _bundle(conf / "bundle")
    lead = [_tool("submit_finding", title="synthesis", body="Both groups reached the same answer.")]
    (conf / "replies.json").write_text(json.dumps({"scripted-worker": worker, "scripted-lead": lead}))
    path = conf / "swarm.toml"
    path.write_text(f"""
[goal]
objective = "Write a Python program that sorts the integers on stdin."
budget_usd = "2"
call_cap = 400
deadline_s = 600
[[tasks.lenses]]
title = "sorter"
prompt = "Submit a program with submit_artifact."
[policy]
kind = "groups"
rounds = 2
broadcast_top = 1
[[policy.groups]]
prompt = "Prove that the program sorts."
[[policy.groups]]
prompt = "Find an input it gets wrong."
[workers]
count = 4
concurrency = {concurrency}
exec_timeout_s = 300
max_steps = {steps}
model = "scripted-worker"
retry_backoff_s = 0.2
[lead]
model = "scripted-lead"
[providers.script]
kind = "scripted"
models = ["scripted-worker", "scripted-lead"]
replies = "replies.json"
{'[evaluator]' + chr(10) + 'bundle = "bundle"' if scored else ''}
[run]
runs_dir = "{folder / 'runs'}"
sandbox = "process"
""")
    return path


def _run(folder: Path, swarm: Path) -> tuple[dict[str, Any], Path]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8",
           "TMPDIR": tempfile.gettempdir(), "SWARMYARD_STATE_DIR": str(folder / "state")}
    done = subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm), "--json"], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    [run_dir] = (folder / "runs").iterdir()
    return json.loads(done.stdout.strip().splitlines()[-1]), run_dir


def _check_every_worker_works(figures: dict[str, Any], db: sqlite3.Connection) -> None:
    """Each round, each group's two attempts were claimed by two agents, each of which made model calls."""
    claims = [json.loads(body) for (body,) in db.execute("SELECT body FROM events WHERE kind = 'task.claimed'")]
    tasks = {tid: (title, group) for tid, title, group in db.execute("SELECT id, title, group_name FROM tasks")}
    work = [c for c in claims if tasks[c["task"]][1] in ("g0", "g1")]
    assert sorted(tasks[c["task"]] for c in work) == sorted(
        (f"sorter (round {r}, attempt {a} of 2)", g) for r in (1, 2) for a in (1, 2) for g in ("g0", "g1"))
    for r in (1, 2):
        claimers = {c["worker"] for c in work if f"(round {r}," in tasks[c["task"]][0]}
        assert len(claimers) == 4, f"round {r}: {len(claimers)} workers held a claim"
        calls = dict(db.execute("SELECT worker_id, COUNT(*) FROM reservations GROUP BY worker_id").fetchall())
        assert all(calls.get(w, 0) >= 1 for w in claimers), calls
    assert figures["workers"] == 5, figures  # four worker slots ran agents, and the lead


def test_every_worker_of_a_group_works_and_the_next_round_beats_the_other_groups_broadcast(
        short_tmp: Path) -> None:
    worker = [_tool("submit_artifact", content="{{last_message}}")] * 200
    figures, run_dir = _run(short_tmp, _swarm(short_tmp, worker, steps=2, scored=True, concurrency=4))
    db = sqlite3.connect(run_dir / "store.db")
    _check_every_worker_works(figures, db)
    best = db.execute("SELECT t.title, MAX(s.score) FROM scores s JOIN tasks t ON t.id = s.task_id WHERE "
                      "s.split = 'search' GROUP BY t.id, t.title").fetchall()
    assert sorted(score for title, score in best if "(round 1," in title) == [1] * 4, best
    assert sorted(score for title, score in best if "(round 2," in title) == [21] * 4, best
    # one broadcast, read by both groups; each group's best round-2 attempt (21) beat the other's best (1) and
    # cites no broadcast (its finding cites its own attempt only)
    assert (figures["broadcast_followups"], figures["built_on_broadcast"], figures["improved_on_broadcast"]) == (
        2, 0, 2), figures
    report = (run_dir / "report.md").read_text()
    assert "0 of 2 best attempts built on another group's broadcast; 2 of 2 beat it (1 broadcast)." in report


def test_a_best_attempt_that_cites_the_broadcast_counts_as_built_on_it(short_tmp: Path) -> None:
    worker = [_tool("submit_finding", title="attempt", body="The program sorts every case I tried.",
                    cite=["1", "2"])] * 40
    figures, run_dir = _run(short_tmp, _swarm(short_tmp, worker, steps=1, scored=False, concurrency=1))
    db = sqlite3.connect(run_dir / "store.db")
    _check_every_worker_works(figures, db)
    posts = dict(db.execute("SELECT seq, group_name FROM posts WHERE kind = 'consolidation'").fetchall())
    assert posts == {1: "g0", 2: "g1"}, posts
    cited = db.execute("SELECT f.group_name, f.citations FROM findings f JOIN tasks t ON t.id = f.task_id "
                       "WHERE t.title LIKE '%(round 2,%'").fetchall()
    assert sorted(g for g, _ in cited) == ["g0", "g0", "g1", "g1"]
    for group, citations in cited:
        assert json.loads(citations) == [{"kind": "post", "ref": "1" if group == "g0" else "2"}], citations
    assert (figures["broadcast_followups"], figures["built_on_broadcast"], figures["improved_on_broadcast"]) == (
        2, 2, 0), figures
