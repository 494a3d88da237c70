"""``swarmyard run`` with the ``groups`` policy, end to end through the console script, in real bubblewrap machines,
on the scripted provider and the sort-numbers evaluator bundle:

- each ``[[policy.groups]]`` table's prompt reaches its group's workers, and only theirs (every worker posts the
  brief it was given: ``{{last_message}}`` of its first call);
- consolidation after round 1 broadcasts, to every group, each group's best finding by score: the attempts score
  5, 3, 2, 0 in the order they run, so in every group the older finding is the better one (newest-first would
  pick the other);
- round 2's workers read that broadcast on their board.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from rigs.scripted import tool_call as _tool

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "bundles" / "sort-numbers"
#: right on 5, 3, 2 and 0 of the bundle's 5 search cases
PROGRAMS = (
    "import sys\nprint(' '.join(map(str, sorted(map(int, sys.stdin.read().split())))))\n",
    "import sys\nx = list(map(int, sys.stdin.read().split()))\nprint(' '.join(map(str, sorted(x) if len(x) <= 5 "
    "else x)))\n",
    "import sys\nprint(' '.join(sys.stdin.read().split()))\n",
    "print()\n",
)
PROVE, DISPROVE = "Prove that the program sorts.", "Find an input it gets wrong."


def _worker_run(program: str, n: int) -> list[dict[str, Any]]:
    return [_tool("board_post", body="{{last_message}}"),  # the brief it was given
            _tool("submit_artifact", content=program),
            _tool("submit_finding", title=f"attempt {n}", body=f"Attempt {n}: a program for the objective.")]


def _swarm(folder: Path) -> Path:
    conf = folder / "conf"
    (conf / "bundles").mkdir(parents=True)
    shutil.copytree(EXAMPLE, conf / "bundles" / "sort-numbers")
    worker = [r for i, p in enumerate(PROGRAMS * 2) for r in _worker_run(p, i)]
    lead = [_tool("submit_finding", title="synthesis", body="The sorter from group g0 sorts every case.")]
    (conf / "replies.json").write_text(json.dumps({"scripted-worker": worker, "scripted-lead": lead}))
    path = conf / "swarm.toml"
    path.write_text(f"""
[goal]
objective = "Write a Python program that sorts the integers on stdin."
budget_usd = "1"
call_cap = 80
deadline_s = 600
[[tasks.lenses]]
title = "first"
prompt = "Submit a program with submit_artifact."
[[tasks.lenses]]
title = "second"
prompt = "Submit another program with submit_artifact."
[policy]
kind = "groups"
rounds = 2
broadcast_top = 1
[[policy.groups]]
prompt = "{PROVE}"
[[policy.groups]]
prompt = "{DISPROVE}"
[workers]
count = 2
concurrency = 1
exec_timeout_s = 180
max_steps = 4
model = "scripted-worker"
retry_backoff_s = 0.2
[lead]
model = "scripted-lead"
[providers.script]
kind = "scripted"
models = ["scripted-worker", "scripted-lead"]
replies = "replies.json"
[evaluator]
bundle = "bundles/sort-numbers"
[run]
runs_dir = "{folder / 'runs'}"
sandbox = "local"
""")
    return path


def test_groups_get_their_own_formulation_and_consolidation_picks_each_groups_best_by_score(
        short_tmp: Path) -> None:
    swarm = _swarm(short_tmp)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8",
           "TMPDIR": tempfile.gettempdir(), "SWARMYARD_STATE_DIR": str(short_tmp / "state")}
    done = subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm)], cwd=short_tmp, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    [run_dir] = (short_tmp / "runs").iterdir()
    db = sqlite3.connect(run_dir / "store.db")

    # every worker's brief (its first post) carries its own group's formulation and not the other's
    briefs = db.execute("SELECT p.group_name, p.body, t.title FROM posts p JOIN tasks t ON t.id = p.task_id "
                        "WHERE p.kind = 'progress' AND p.body LIKE 'Task:%'").fetchall()
    assert sorted((g, t) for g, _, t in briefs) == sorted(
        (g, f"{lens} (round {r})") for g in ("g0", "g1") for lens in ("first", "second") for r in (1, 2))
    for group, body, _ in briefs:
        mine, theirs = (PROVE, DISPROVE) if group == "g0" else (DISPROVE, PROVE)
        assert f"Your group's formulation: {mine}" in body and theirs not in body, (group, body)

    # round 1: per group, the finding whose task scored best; the attempts ran in falling score order
    rows = db.execute("SELECT f.id, f.group_name, f.created_at, MAX(s.score) FROM findings f JOIN tasks t ON "
                      "t.id = f.task_id JOIN scores s ON s.task_id = f.task_id AND s.split = 'search' "
                      "WHERE t.title LIKE '% (round 1)' GROUP BY f.id, f.group_name, f.created_at").fetchall()
    assert sorted(score for *_, score in rows) == [0, 2, 3, 5]
    consolidations = db.execute("SELECT group_name, body FROM posts WHERE kind = 'consolidation' ORDER BY seq"
                                ).fetchall()
    assert sorted(g for g, _ in consolidations) == ["g0", "g1"], "broadcast to every group"
    text = consolidations[0][1]
    assert all(body == text for _, body in consolidations)
    for group in ("g0", "g1"):
        mine = sorted((r for r in rows if r[1] == group), key=lambda r: r[2])
        assert len(mine) == 2 and mine[0][3] > mine[1][3], "the older attempt of each group is its better one"
        best, other = mine
        assert f"[{best[0]}] group {group} (score {best[3]})" in text
        assert other[0] not in text
    # round 2's workers read the broadcast on their board
    round2 = [body for _, body, title in briefs if title.endswith("(round 2)")]
    assert round2 and all("Consolidation after round 1" in body for body in round2)
    assert re.search(r"\[fnd_[0-9a-z]+\] group g1 \(score \d\)", text)
