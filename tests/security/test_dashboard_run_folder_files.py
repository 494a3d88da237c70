"""``swarmyard ui RUN_FOLDER`` on a run folder made by someone else: its files are read only as the folder's own
regular files, and a bounded part of each.

One real run (``swarmyard run``, scripted provider, local machines), then copies of its folder in which one file
is replaced: a worker's trajectory by a named pipe (its open waited for a writer: the command never served), the
last checkpoint note by a link to ``/dev/zero`` (read whole: the process grew without bound), a trajectory by a
link to a file outside the folder (served on the page), an agent log by a named pipe (every state request
waited for ever), ``run.json`` by a deeply nested array and the note's size line by a digit ``int`` refuses. Each
copy is served through the console script: the line that says where comes, the state and trajectory routes
answer, nothing outside the folder is shown, and SIGTERM ends it with exit 0.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from rigs.scripted import tool_call
from rigs.swarm_files import scripted_swarm

pytestmark = [
    pytest.mark.bwrap,
]

SWARMYARD = Path(sys.executable).with_name("swarmyard")
SECRET = "NOT-THIS-RUNS-FILE"


@pytest.fixture(scope="module")
def finished_run() -> Iterator[tuple[Path, dict[str, str]]]:
    folder = Path(tempfile.mkdtemp(prefix="sy-uf-"))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    swarm = scripted_swarm(folder, agent="builtin", replies="replies.json")
    (folder / "conf" / "replies.json").write_text(json.dumps({
        "scripted-worker": [tool_call("board_post", body="a note"),
                            tool_call("submit_finding", title="market", body="Large and growing.")],
        "scripted-lead": [tool_call("submit_finding", title="synthesis", body="Go: the market is large.")],
    }))
    done = subprocess.run([str(SWARMYARD), "run", str(swarm)], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    (run_dir,) = (folder / "runs").iterdir()
    yield run_dir, env
    shutil.rmtree(folder, ignore_errors=True)


def _copy(run_dir: Path, name: str) -> Path:
    copy = run_dir.parent / name
    shutil.copytree(run_dir, copy, symlinks=True, ignore=shutil.ignore_patterns("*.sock"))
    state = json.loads((copy / "run.json").read_text())
    state.update(run_id=name, store_url=f"sqlite:///{copy / 'store.db'}")
    (copy / "run.json").write_text(json.dumps(state))
    return copy


def _fifo_trajectory(folder: Path) -> None:
    path = next((folder / "agents").glob("worker-0-*.jsonl"))
    path.unlink()
    os.mkfifo(path)


def _fifo_log(folder: Path) -> None:
    path = next((folder / "agents").glob("worker-0-*.log"))
    path.unlink()
    os.mkfifo(path)


def _zero_note(folder: Path) -> None:
    (folder / "audit" / "checkpoints" / "999999.note").symlink_to("/dev/zero")


def _outside_trajectory(folder: Path) -> None:
    outside = folder.parent / "outside.jsonl"
    outside.write_text(json.dumps({"step": 1, "said": SECRET, "cpu_ms": 1, "max_rss_kb": 1}) + "\n")
    path = next((folder / "agents").glob("worker-0-*.jsonl"))
    path.unlink()
    path.symlink_to(outside)


def _odd_note(folder: Path) -> None:
    (folder / "audit" / "checkpoints" / "999999.note").write_text("origin\n\u00b2\n")


CRAFTED: dict[str, Callable[[Path], None]] = {
    "fifo-trajectory": _fifo_trajectory, "fifo-log": _fifo_log, "zero-note": _zero_note,
    "outside-trajectory": _outside_trajectory, "odd-note": _odd_note,
}


def _serve(folder: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str, str]:
    proc = subprocess.Popen([str(SWARMYARD), "ui", str(folder)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    # the line that says where; one that never comes fails the test (the process is killed) rather than hang it
    ready, _, _ = select.select([proc.stderr], [], [], 300)
    if not ready:
        proc.kill()
        proc.wait()
    line = proc.stderr.readline() if ready else "(it never said where it serves)"
    found = re.search(r"(http://\S+)/ui\b.*operator token in (.+?)\)", line)
    assert found is not None, line
    return proc, found[1], Path(found[2]).read_text().strip()


def _stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return -9


@pytest.mark.parametrize("crafted", sorted(CRAFTED))
def test_a_crafted_run_folder_is_served_from_its_own_regular_files(
        finished_run: tuple[Path, dict[str, str]], crafted: str) -> None:
    run_dir, env = finished_run
    folder = _copy(run_dir, crafted)
    CRAFTED[crafted](folder)
    proc, base, token = _serve(folder, env)
    try:
        auth = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=base, headers=auth, timeout=60) as client:
            (goal,) = client.get("/ui/api/goals").json()["goals"]
            state = client.get("/ui/api/state", params={"goal": goal["id"]})
            assert state.status_code == 200, state.text
            workers = [w["id"] for w in state.json()["workers"]]
            for worker in workers:
                trajectory = client.get(f"/ui/api/trajectory/{worker}")
                assert trajectory.status_code == 200 and SECRET not in trajectory.text, trajectory.text[:500]
            assert SECRET not in state.text
    finally:
        code = _stop(proc)
    assert code == 0


def _run_id(folder: Path, run_id: str) -> None:
    state = json.loads((folder / "run.json").read_text())
    (folder / "run.json").write_text(json.dumps({**state, "run_id": run_id}))


@pytest.mark.parametrize(("crafted", "said"), [
    ("deep-run-json", "is not a run folder"), ("long-run-id", "its run id is not one"),
    ("nul-run-id", "its run id is not one")])
def test_a_run_json_this_command_cannot_use_is_a_user_error(finished_run: tuple[Path, dict[str, str]],
                                                            crafted: str, said: str) -> None:
    run_dir, env = finished_run
    folder = _copy(run_dir, crafted)
    if crafted == "deep-run-json":
        (folder / "run.json").write_text("[" * 200_000 + "]" * 200_000)
    else:  # the run id names a folder of the user's state: one the file system cannot make was an internal error
        _run_id(folder, "r" * 5000 if crafted == "long-run-id" else "run_\0x")
    done = subprocess.run([str(SWARMYARD), "ui", str(folder)], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 1 and "(user_error)" in done.stderr and said in done.stderr, done.stderr[-2000:]


def _corrupt(folder: Path, sql: str) -> None:
    with sqlite3.connect(folder / "store.db") as db:
        assert db.execute(sql).rowcount == 1


def test_a_store_row_this_version_cannot_read_is_a_typed_error(finished_run: tuple[Path, dict[str, str]]) -> None:
    run_dir, env = finished_run
    # read when the folder is opened: a user error, exit 1, and nothing served
    folder = _copy(run_dir, "bad-task-state")
    _corrupt(folder, "UPDATE tasks SET state = 'bogus' WHERE rowid = (SELECT MIN(rowid) FROM tasks)")
    done = subprocess.run([str(SWARMYARD), "ui", str(folder)], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 1 and "(user_error)" in done.stderr and "cannot read" in done.stderr, done.stderr
    # read per request: the state route and the stream answer with a code and a message, the server stays up
    for name, sql in (("bad-citations", "UPDATE findings SET citations = '{not json' "
                                        "WHERE rowid = (SELECT MIN(rowid) FROM findings)"),
                      ("bad-hold", "UPDATE reservations SET state = 'weird' "
                                   "WHERE rowid = (SELECT MIN(rowid) FROM reservations)")):
        folder = _copy(run_dir, name)
        _corrupt(folder, sql)
        proc, base, token = _serve(folder, env)
        try:
            with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
                (goal,) = client.get("/ui/api/goals").json()["goals"]
                state = client.get("/ui/api/state", params={"goal": goal["id"]})
                assert state.status_code == 500 and state.json()["error"]["code"] == "store_error", state.text
                assert "cannot read" in state.json()["error"]["message"]
                with client.stream("GET", "/ui/events", params={"goal": goal["id"]}) as events:
                    data = next(line for line in events.iter_lines() if line.startswith("data: "))
                assert json.loads(data.removeprefix("data: "))["error"]["code"] == "store_error", data
                assert client.get("/ui/api/goals").status_code == 200
        finally:
            code = _stop(proc)
        assert code == 0


def test_a_store_older_than_this_swarmyard_is_refused_unchanged(finished_run: tuple[Path, dict[str, str]]) -> None:
    # a run made by an earlier swarmyard: opening its store would migrate it (a write the dashboard must not make,
    # after which the swarmyard that made the run refuses its store as newer than itself)
    run_dir, env = finished_run
    folder = _copy(run_dir, "older-store")
    with sqlite3.connect(folder / "store.db") as db:
        (version,) = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(int(version) - 1),))
    db.close()
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    done = subprocess.run([str(SWARMYARD), "ui", str(folder)], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 1 and "(user_error)" in done.stderr, done.stderr[-2000:]
    assert f"schema version {int(version) - 1}, older than this swarmyard's {version}" in done.stderr
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before
