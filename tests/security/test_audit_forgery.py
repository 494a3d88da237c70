"""Forgeries in a finished run's store that ``swarmyard audit verify`` must call BAD (exit 1), and a resume must
refuse to sign; and a run whose witness did not cosign its last checkpoint exits 1.

The verdicts come only from the installed console script, in a subprocess. The fixture is a finished run made
with the library the way the coordinator ends one (a ``run.closed`` event, then a checkpoint); the forgeries are
plain SQL on its ``store.db``, as an attacker with the file would write them. The runs at the end are real
``swarmyard run`` processes in bubblewrap machines on the scripted provider, cosigned by a real witness server.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from conftest import serving_witness
from rigs.swarm_files import scripted_swarm
from swarmyard.audit.checkpoint import Checkpoint
from swarmyard.audit.log import RUN_CLOSED, AuditLog, list_checkpoints
from swarmyard.audit.note import COSIGNATURE_V1, Signer, sign_note
from swarmyard.audit.witness import Witness, WitnessState
from swarmyard.domain import Citation, CitationKind, GoalSpec, TaskSpec
from swarmyard.store import open_store

SWARMYARD = Path(sys.executable).with_name("swarmyard")
ORIGIN = "swarmyard.test/run-1"
FORGED = "INSERT INTO events (leaf_index, kind, body, created_at) VALUES (NULL, 'finding.submitted', " \
         "CAST('{\"kind\":\"finding.submitted\",\"forged\":1}' AS BLOB), 1)"


def sy(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The console script, run to its end in a clean environment."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd), "LANG": "C.UTF-8",
           "SWARMYARD_STATE_DIR": str(cwd / "state")}
    return subprocess.run([str(SWARMYARD), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def bad(done: subprocess.CompletedProcess[str], prefix: str) -> None:
    """Exit 1 with a BAD line starting with ``prefix``, no traceback."""
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert done.stdout.startswith(f"BAD {prefix}"), done.stdout
    assert "Traceback" not in done.stderr


@pytest.fixture
def home() -> Iterator[Path]:
    """A short throwaway folder (Unix sockets live in it) as cwd and $HOME."""
    path = Path(tempfile.mkdtemp(prefix="sy-f-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _finished_run(home: Path, *, closed: bool = True, url: str | None = None, scored: bool = False) -> Path:
    """A run folder with a task done with a finding and an artifact, checkpointed, cosigned and (by default)
    closed the way the coordinator closes a run; its store is ``store.db`` unless ``url`` names another."""
    run = home / "runs" / "run_1"
    run.mkdir(parents=True)
    store = open_store(url or f"sqlite:///{run / 'store.db'}", blob_dir=run / "blobs")
    witness = Witness(Signer("witness.test", Ed25519PrivateKey.generate(), COSIGNATURE_V1),
                      WitnessState(home / "witness-state.json"))
    try:
        log = AuditLog(store, run / "audit", ORIGIN, witness=witness)
        goal = store.create_goal(GoalSpec(objective="audit me", budget_micro_usd=1_000_000, call_cap=10))
        store.create_task(goal.id, TaskSpec(title="t0", budget_micro_usd=1000, call_cap=2))
        store.create_task(goal.id, TaskSpec(title="t1", budget_micro_usd=1000, call_cap=2))
        log.checkpoint()
        claim = store.claim(goal.id, "w1", 60.0)
        assert claim is not None
        art = store.put_artifact(claim.task.id, claim.token, b"the evidence", author="w1")
        store.submit_finding(claim.task.id, claim.token, author="w1", title="f", body="THE REAL FINDING",
                             citations=[Citation(CitationKind.ARTIFACT, art.sha256)])
        store.complete(claim.task.id, claim.token, "finding submitted")
        if scored:  # the evaluator's search score and its holdout score of the artifact
            store.record_score(goal.id, art.sha256, 5)
            store.record_score(goal.id, art.sha256, 7, split="holdout")
        if closed:
            store.record_event(RUN_CLOSED, {"goal": goal.id, "run": "run_1"})
        log.checkpoint()
        log.close()
    finally:
        store.close()
    return run


def _keys(run: Path) -> list[str]:
    """The run's keys pinned, and its log's origin named: the fixture's witness is in this process, with no home
    to read, and its origin is not the one a run folder's name fixes (these tests are about the store)."""
    log_key = (run / "audit" / "log.vkey").read_text().strip()
    return ["--log-key", log_key, "--witness-key", (run / "audit" / "witness.vkey").read_text().strip(),
            "--origin", log_key.split("+")[0], "--no-witness"]


def _sql(run: Path, statement: str, *params: object) -> None:
    with sqlite3.connect(run / "store.db") as db:
        db.execute(statement, params)


def _one(run: Path, query: str) -> object:
    with sqlite3.connect(run / "store.db") as db:
        return db.execute(query).fetchone()[0]


def test_the_untouched_run_verifies_and_says_it_checked_the_tables(home: Path) -> None:
    run = _finished_run(home)
    done = sy(home, "audit", "verify", str(run), *_keys(run))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "closed, tables match" in done.stdout
    report = json.loads(sy(home, "audit", "verify", str(run), *_keys(run), "--json").stdout)
    assert (report["closed"], report["tables_checked"], report["uncovered"]) == (True, True, 0)


def test_an_unsequenced_forged_event_is_bad(home: Path) -> None:
    run = _finished_run(home)
    _sql(run, FORGED)
    forged_id = _one(run, "SELECT MAX(id) FROM events")
    bad(sy(home, "audit", "verify", str(run), *_keys(run)), f"unsequenced {forged_id}: event row {forged_id} "
                                                            f"('finding.submitted') has no leaf index")
    # the log says the run closed: "in progress" does not excuse it
    bad(sy(home, "audit", "verify", str(run), *_keys(run), "--in-progress"), f"unsequenced {forged_id}")
    # sequenced (as a resume used to do) it is a leaf past the last checkpoint: still bad
    _sql(run, "UPDATE events SET leaf_index = (SELECT MAX(leaf_index) + 1 FROM events) WHERE id = ?", forged_id)
    size = _one(run, "SELECT MAX(leaf_index) FROM events")
    bad(sy(home, "audit", "verify", str(run), *_keys(run), "--in-progress"),
        f"event {size}: not covered by any checkpoint (the run closed at the last checkpoint)")


def test_a_run_in_progress_may_have_uncovered_events_only_when_asked(home: Path) -> None:
    run = _finished_run(home, closed=False)
    _sql(run, FORGED)
    bad(sy(home, "audit", "verify", str(run), *_keys(run)), "unsequenced")
    live = sy(home, "audit", "verify", str(run), *_keys(run), "--in-progress")
    assert live.returncode == 0, live.stdout
    assert "in progress: 1 newer events not covered yet, tables not checked" in live.stdout


def test_rewritten_rows_are_bad_and_named(home: Path) -> None:
    run = _finished_run(home)
    keys = _keys(run)
    finding = str(_one(run, "SELECT id FROM findings"))
    _sql(run, "UPDATE findings SET body = 'FORGED FINDING'")
    done = sy(home, "audit", "verify", str(run), *keys)
    bad(done, "finding ")
    assert f"{finding}: its body_sha256 {hashlib.sha256(b'FORGED FINDING').hexdigest()!r}" in done.stdout
    _sql(run, "UPDATE findings SET body = 'THE REAL FINDING'")
    assert sy(home, "audit", "verify", str(run), *keys).returncode == 0

    done_task = str(_one(run, "SELECT id FROM tasks WHERE state = 'done'"))
    _sql(run, "UPDATE tasks SET state = 'failed'")
    done = sy(home, "audit", "verify", str(run), *keys)
    bad(done, "task ")
    assert f"{done_task}: its state 'failed' is not what event" in done.stdout and "('done')" in done.stdout
    _sql(run, "UPDATE tasks SET state = 'pending' WHERE id != ?", done_task)
    _sql(run, "UPDATE tasks SET state = 'done' WHERE id = ?", done_task)
    assert sy(home, "audit", "verify", str(run), *keys).returncode == 0

    _sql(run, "UPDATE findings SET status = 'verified', score = 100")
    bad(sy(home, "audit", "verify", str(run), *keys), "finding ")
    _sql(run, "UPDATE findings SET status = 'submitted', score = NULL")

    # a row inserted by hand: no event describes it
    _sql(run, "INSERT INTO findings (id, goal_id, task_id, group_name, author, title, body, citations, status, "
              "created_at) SELECT 'fnd_forged', goal_id, task_id, group_name, author, title, 'x', '[]', status, "
              "created_at FROM findings")
    done = sy(home, "audit", "verify", str(run), *keys)
    bad(done, "finding -1: fnd_forged: no event in the log describes this row")
    _sql(run, "DELETE FROM findings WHERE id = 'fnd_forged'")
    # a row deleted: its events still describe it
    _sql(run, "DELETE FROM findings")
    bad(sy(home, "audit", "verify", str(run), *keys), "finding ")


def test_a_rewritten_artifact_blob_is_bad(home: Path) -> None:
    run = _finished_run(home)
    sha = str(_one(run, "SELECT sha256 FROM artifacts"))
    blob = run / "blobs" / sha[:2] / sha[2:]
    blob.write_bytes(b"other evidence")
    done = sy(home, "audit", "verify", str(run), *_keys(run))
    bad(done, "artifact ")
    assert f"{sha}: its blob is missing or does not hash to its name" in done.stdout
    blob.unlink()
    bad(sy(home, "audit", "verify", str(run), *_keys(run)), "artifact ")
    blob.write_bytes(b"the evidence")
    _sql(run, "UPDATE artifacts SET size = 1")
    bad(sy(home, "audit", "verify", str(run), *_keys(run)), "artifact ")


def test_a_score_row_rewritten_added_or_deleted_and_a_deleted_artifact_row_are_bad(home: Path) -> None:
    """Campaigns and a resumed run's holdout read the scores table: every row is held to its score.recorded event,
    and a row an event describes must be there."""
    run = _finished_run(home, scored=True)
    keys = _keys(run)
    ok = sy(home, "audit", "verify", str(run), *keys)
    assert ok.returncode == 0 and "tables match" in ok.stdout, ok.stdout + ok.stderr
    _sql(run, "UPDATE scores SET score = 1 WHERE split = 'holdout'")
    done = sy(home, "audit", "verify", str(run), *keys)
    bad(done, "score ")
    assert "its score 1 is not what event" in done.stdout and "(7)" in done.stdout, done.stdout
    _sql(run, "UPDATE scores SET score = 7 WHERE split = 'holdout'")
    assert sy(home, "audit", "verify", str(run), *keys).returncode == 0
    _sql(run, "DELETE FROM scores WHERE split = 'holdout'")
    done = sy(home, "audit", "verify", str(run), *keys)
    bad(done, "score ")
    assert "records it and the store has no such row" in done.stdout, done.stdout
    _sql(run, "INSERT INTO scores (goal_id, task_id, worker_id, group_name, direction, sha256, split, score, "
              "created_at) SELECT goal_id, task_id, worker_id, group_name, direction, sha256, 'holdout', 7, created_at "
              "FROM scores")
    assert sy(home, "audit", "verify", str(run), *keys).returncode == 0
    _sql(run, "INSERT INTO scores (goal_id, task_id, worker_id, group_name, direction, sha256, split, score, "
              "created_at) SELECT goal_id, task_id, worker_id, group_name, direction, sha256, split, 99, created_at "
              "FROM scores WHERE split = 'holdout'")
    bad(sy(home, "audit", "verify", str(run), *keys), "score -1: ")  # a row no event describes
    _sql(run, "DELETE FROM scores WHERE score = 99")
    _sql(run, "DELETE FROM artifacts")
    done = sy(home, "audit", "verify", str(run), *keys)
    bad(done, "artifact ")
    assert "describes it and the store has no such row" in done.stdout, done.stdout


def test_event_columns_outside_the_hash_are_held_to_the_body(home: Path) -> None:
    run = _finished_run(home)
    keys = _keys(run)
    _sql(run, "UPDATE events SET kind = 'forged' WHERE leaf_index = 5")
    bad(sy(home, "audit", "verify", str(run), *keys), "event 5: its kind column 'forged' is not its body's kind")
    _sql(run, "UPDATE events SET kind = (SELECT json_extract(CAST(body AS TEXT), '$.kind')) WHERE leaf_index = 5")
    assert sy(home, "audit", "verify", str(run), *keys).returncode == 0
    _sql(run, "UPDATE events SET created_at = 0 WHERE leaf_index = 5")
    bad(sy(home, "audit", "verify", str(run), *keys), "event 5: its created_at column 0.0 is not its body's time")
    # a board post's body carries the post's kind; its column must still be board.posted
    _sql(run, "UPDATE events SET kind = 'board.posted' WHERE leaf_index = 1")
    bad(sy(home, "audit", "verify", str(run), *keys), "event 1: its kind column 'board.posted'")


# -- real runs: a resume refuses forged events; a run its witness did not cosign exits 1 -----------------------


def _tool(name: str, **arguments: str) -> dict[str, object]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def _swarm(folder: Path) -> Path:
    conf = folder / "conf"
    (conf / "replies").mkdir(parents=True, exist_ok=True)
    tool = _tool
    (conf / "replies" / "answers.json").write_text(json.dumps({
        "scripted-worker": [tool("submit_finding", title="market", body="Large and growing.")],
        "scripted-lead": [tool("submit_finding", title="synthesis", body="Go.")],
    }))
    return scripted_swarm(folder)


@pytest.mark.bwrap
@pytest.mark.slow
def test_a_resume_refuses_to_sign_events_written_after_the_run_closed(home: Path) -> None:
    swarm = _swarm(home)
    witness = Witness.from_files("witness.test", home / "w.key", home / "w.json")
    sock = home / "w.sock"
    with serving_witness(witness, sock):
        first = sy(home, "run", str(swarm), "--witness", str(sock), "--quiet")
        assert first.returncode == 0, first.stderr[-3000:]
        [run] = (home / "runs").iterdir()
        keys = _keys(run)
        assert sy(home, "audit", "verify", str(run), *keys, "--witness", str(sock)).returncode == 0
        checkpoints = len(list_checkpoints(run / "audit"))

        _sql(run, FORGED)
        bad(sy(home, "audit", "verify", str(run), *keys), "unsequenced")
        resumed = sy(home, "run", str(swarm), "--resume", run.name, "--witness", str(sock), "--quiet")
        assert resumed.returncode == 1, resumed.stdout + resumed.stderr
        assert "refusing to sign event" in resumed.stderr and "after the run closed" in resumed.stderr
        assert "Traceback" not in resumed.stderr
        assert len(list_checkpoints(run / "audit")) == checkpoints  # nothing signed
        bad(sy(home, "audit", "verify", str(run), *keys), "event ")  # sequenced now, and past the checkpoint

        # without the forged row the same resume goes through and the log verifies, cosigned
        _sql(run, "DELETE FROM events WHERE CAST(body AS TEXT) LIKE '%\"forged\":1%'")
        again = sy(home, "run", str(swarm), "--resume", run.name, "--witness", str(sock), "--quiet")
        assert again.returncode == 0, again.stderr[-3000:]
        assert sy(home, "audit", "verify", str(run), *keys, "--witness", str(sock)).returncode == 0


@pytest.mark.bwrap
@pytest.mark.slow
def test_a_run_whose_witness_did_not_cosign_the_last_checkpoint_exits_1(home: Path) -> None:
    swarm = _swarm(home)
    first = sy(home, "run", str(swarm), "--quiet", "--no-witness")  # the log's own checkpoints only
    assert first.returncode == 0, first.stderr[-3000:]
    [run] = (home / "runs").iterdir()
    # a witness that already holds another log under this run's origin: it answers, and refuses to cosign
    witness = Witness.from_files("witness.test", home / "w.key", home / "w.json")
    origin = f"swarmyard.local/{run.name}"
    other = Signer(origin, Ed25519PrivateKey.generate())
    witness.add_checkpoint(0, [], sign_note(Checkpoint(origin, 0, hashlib.sha256(b"").digest()).body,
                                            [other]).render(), log_vkey=other.verifier.vkey)
    (run / "report.md").unlink()
    with serving_witness(witness, home / "w.sock"):
        done = sy(home, "run", str(swarm), "--resume", run.name, "--witness", str(home / "w.sock"), "--quiet")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "the witness did not cosign the last checkpoint" in lines[0], done.stderr
    assert "Traceback" not in done.stderr
    assert "last checkpoint NOT cosigned" in (run / "report.md").read_text()  # the report is still written


def _execute(url: str, run: Path, statement: str) -> None:
    """Plain SQL on the store at ``url``, the way an attacker holding it would write it."""
    if url.startswith("sqlite"):
        _sql(run, statement)
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement.encode())


def test_forgeries_are_bad_on_each_engine(home: Path, store_url: str) -> None:
    url = store_url if not store_url.startswith("sqlite") else f"sqlite:///{home / 'runs' / 'run_1' / 'store.db'}"
    run = _finished_run(home, url=url)
    verify = [*_keys(run), "--store", url]
    assert sy(home, "audit", "verify", str(run), *verify).returncode == 0
    to_bytes = "convert_to('{\"kind\":\"finding.submitted\"}', 'UTF8')" if "postgres" in url \
        else "CAST('{\"kind\":\"finding.submitted\"}' AS BLOB)"
    _execute(url, run, f"INSERT INTO events (leaf_index, kind, body, created_at) VALUES "
                       f"(NULL, 'finding.submitted', {to_bytes}, 1)")
    bad(sy(home, "audit", "verify", str(run), *verify), "unsequenced ")
    _execute(url, run, "DELETE FROM events WHERE leaf_index IS NULL")
    _execute(url, run, "UPDATE findings SET body = 'FORGED FINDING'")
    bad(sy(home, "audit", "verify", str(run), *verify), "finding ")
    _execute(url, run, "UPDATE findings SET body = 'THE REAL FINDING'")
    _execute(url, run, "UPDATE events SET kind = 'forged', created_at = 0 WHERE leaf_index = 5")
    bad(sy(home, "audit", "verify", str(run), *verify), "event 5: its kind column 'forged'")
