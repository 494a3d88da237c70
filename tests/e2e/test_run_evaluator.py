"""``swarmyard run`` with ``[evaluator] bundle = ...``: the isolated evaluator in a scored run, end to end.

Through the console script, in real bubblewrap machines, on the scripted provider and the sort-numbers bundle:
the worker submits a sorting program and sees its signed score in the tool's result; the score is stored with
the artifact and the finding citing it and audit-logged; the final holdout fires once when the run ends, on the
best search-scored artifact; a second holdout for the goal is refused, also by a restarted evaluator; the worker
cannot reach the evaluator's socket from its machine; the bundle folder is never changed; the report and the
terminal summary show the holdout, the best search score over time and who reached it.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rigs.scripted import tool_call as _tool
from rigs.swarm_files import SORT_NUMBERS, SORT_OBJECTIVE, scripted_run
from swarmyard.errors import HoldoutUsedError
from swarmyard.evaluator.client import EvaluatorClient
from swarmyard.evaluator.process import EvaluatorProcess, run_folder
from swarmyard.evaluator.score import SignedScore, verify_score

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

SORTER = "import sys\nprint(' '.join(map(str, sorted(map(int, sys.stdin.read().split())))))\n"
HALF = "import sys\nprint(' '.join(sys.stdin.read().split()))\n"  # right only on cases already sorted
#: run in the worker's machine: every socket it can find, and whether it can connect to each
PROBE = (
    "python3 -c \"import glob, json, socket\n"
    "found = sorted(set(glob.glob('/tmp/**/*.sock', recursive=True) + glob.glob('/run/**/*.sock', recursive=True)"
    " + glob.glob('/var/**/*.sock', recursive=True) + glob.glob('/machine/**/*.sock', recursive=True)))\n"
    "ok = []\n"
    "for path in found:\n"
    "    s = socket.socket(socket.AF_UNIX)\n"
    "    try:\n"
    "        s.connect(path); ok.append(path)\n"
    "    except OSError:\n"
    "        pass\n"
    "print('PROBE ' + json.dumps({'found': found, 'connected': ok}))\""
)


def _swarm(folder: Path) -> Path:
    worker = [
        _tool("submit_artifact", content=HALF),
        _tool("board_post", body="{{last_message}}"),  # what the tool answered: the signed score
        _tool("submit_artifact", content=SORTER),
        _tool("board_post", body="{{last_message}}"),
        _tool("shell", command=PROBE),
        _tool("board_post", body="{{last_message}}"),
        _tool("submit_finding", title="sorter", body="A program that sorts its input."),
    ]
    lead = [_tool("submit_finding", title="synthesis", body="The sorter sorts.")]
    return scripted_run(folder, {"scripted-worker": worker, "scripted-lead": lead}, objective=SORT_OBJECTIVE,
                        lens=("sorter", "Submit a sorting program with submit_artifact."),
                        workers={"exec_timeout_s": 180, "max_steps": 10, "retry_backoff_s": 0.2},
                        bundle=SORT_NUMBERS)


def _modes(root: Path) -> dict[str, tuple[int, int, int, bytes]]:
    return {str(p.relative_to(root)): (p.stat().st_uid, p.stat().st_gid, p.stat().st_mode,
                                       p.read_bytes() if p.is_file() else b"")
            for p in [root, *root.rglob("*")]}


def test_a_scored_run_scores_artifacts_fires_the_holdout_once_and_reports_it(short_tmp: Path) -> None:
    swarm = _swarm(short_tmp)
    bundle = short_tmp / "conf" / "bundles" / "sort-numbers"
    before = _modes(bundle)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8",
           "TMPDIR": tempfile.gettempdir(), "SWARMYARD_STATE_DIR": str(short_tmp / "state")}
    done = subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm)], cwd=short_tmp, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "The sorter sorts."
    assert _modes(bundle) == before  # the bundle folder was only read
    [run_dir] = (short_tmp / "runs").iterdir()
    db = sqlite3.connect(run_dir / "store.db")
    (goal_id, evaluator), = db.execute("SELECT id, evaluator FROM goals").fetchall()
    assert evaluator == str(bundle.resolve())

    # scored on the search split (5 cases; the echo is right only where a case is already sorted), stored with
    # the artifact, and the finding that cites both carries the best
    shas = {str(r[0]): str(r[1]) for r in db.execute("SELECT a.sha256, a.author FROM artifacts a")}
    search = db.execute("SELECT sha256, score, worker_id FROM scores WHERE split = 'search' ORDER BY n").fetchall()
    assert [s for _, s, _ in search][1] == 5 and search[0][1] < 5
    assert {sha for sha, _, _ in search} == set(shas)
    best_sha = search[1][0]
    (finding_score, cites), = db.execute("SELECT score, citations FROM findings WHERE title = 'sorter'").fetchall()
    assert finding_score == 5 and best_sha in cites

    # the worker saw its signed score in the tool's result, and could reach no evaluator socket
    posts = [str(r[0]) for r in db.execute("SELECT body FROM posts ORDER BY seq")]
    scored = [p for p in posts if p.startswith("Result of submit_artifact")]
    assert len(scored) == 2 and '"split": "search"' in scored[1] and '"score": 5' in scored[1]
    [probe] = [p for p in posts if "PROBE " in p]
    found = json.loads(probe.split("PROBE ", 1)[1].split("\n")[0].rstrip('"').replace('\\"', '"'))
    assert not any("eval" in path for path in found["found"]), found
    # what it reaches is its own machine's: the plane's socket and its init's control socket
    assert "/run/swarmyard/plane.sock" in found["connected"], found
    assert set(found["connected"]) <= {"/run/swarmyard/plane.sock", "/run/swarmyard/ctl/init.sock"}, found

    # the holdout fired once, on the best artifact, and was audit-logged with its signature
    holdout = db.execute("SELECT sha256, score FROM scores WHERE split = 'holdout'").fetchall()
    assert holdout == [(best_sha, 5)]
    events = [(str(k), json.loads(bytes(b))) for k, b in db.execute("SELECT kind, body FROM events ORDER BY id")]
    issued = [body for kind, body in events if kind == "score.issued"]
    assert len(issued) == 2
    [fired] = [body for kind, body in events if kind == "holdout.scored"]
    signed = SignedScore.from_dict(fired["score"])
    assert (signed.goal, signed.split, signed.score, signed.artifact_sha256) == (goal_id, "holdout", 5, best_sha)
    # the log says which key signed them: every score verifies from the log alone
    [started] = [body for kind, body in events if kind == "evaluator.started"]
    assert started["goal"] == goal_id and started["bundle"] == "sort-numbers"
    key = base64.b64decode(started["public_key"])
    assert verify_score(signed, key) and all(verify_score(SignedScore.from_dict(b["score"]), key) for b in issued)
    db.close()
    audit = subprocess.run([sys.executable, "-m", "swarmyard.cli", "audit", "verify", str(run_dir)], cwd=short_tmp,
                           env=env, capture_output=True, text=True, timeout=120)
    assert audit.returncode == 0, audit.stdout + audit.stderr

    # the report and the terminal summary: the holdout, the best search score over time and who reached it
    report = (run_dir / "report.md").read_text()
    assert "## Scores" in report and f"holdout: 5 (artifact {best_sha[:12]} by worker-0" in report
    assert f"| 5 | worker-0 | {best_sha[:12]} |" in report
    assert f"Its scores verify with its key `{started['public_key']}`" in report
    assert "holdout 5" in done.stderr and "best search score 5 by worker-0" in done.stderr
    user = "swarmyard-eval" if os.geteuid() == 0 else None
    if user is not None:
        assert f"as {user} (its own user)" in done.stderr and f"as {user} (its own user)" in report

    # a resumed run finds the holdout done in the store and never asks again; its report still shows it
    resumed = subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm), "--resume", run_dir.name],
                             cwd=short_tmp, env=env, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "holdout 5" in resumed.stderr
    with sqlite3.connect(run_dir / "store.db") as db:
        kinds = [str(k) for (k,) in db.execute("SELECT kind FROM events")]
        assert db.execute("SELECT COUNT(*) FROM scores WHERE split = 'holdout'").fetchone() == (1,)
    assert kinds.count("holdout.scored") == 1 and "holdout.refused" not in kinds

    # a second holdout for the goal is refused, by a restarted evaluator on the run's state: its key and ledger
    # stayed, its copy of the bundle did not
    state = run_folder(run_dir.name) / "state"
    assert (state / "holdout.db").is_file() and (state / "evaluator.key").is_file()
    assert not (state / "bundle").exists()
    try:
        with EvaluatorProcess.start(bundle, run_id=run_dir.name, goal=goal_id) as again:
            assert verify_score(signed, again.public_key)  # the same key, kept in its state
            with EvaluatorClient(again.socket) as client:
                with pytest.raises(HoldoutUsedError):
                    client.final_holdout(goal_id, SORTER.encode())
                assert client.score(goal_id, SORTER.encode()).score == 5  # search scores still answer
    finally:
        shutil.rmtree(run_folder(run_dir.name), ignore_errors=True)
