"""``swarmyard runs list``, ``runs show`` and ``swarmyard ui`` on run folders made by hand or by someone else.

One real run (``swarmyard run``, scripted provider, local machines), then copies of its folder beside hand-made
ones, each read through the console script:

- a store file that is no SQLite database (empty, random bytes, text) or whose pages are damaged: ``runs list``
  ended in 'error (internal): DatabaseError: file is not a database' and listed no run at all, the good one
  included; ``runs show`` and ``swarmyard ui`` said the same; an empty store file was written (SQLite takes it
  for an empty database, and the store's tables were made in it). Now ``runs list`` lists the good run and says
  each other one is unreadable, ``runs show`` and ``ui`` exit 1 with a user error, and no file changes.
- the last checkpoint note, or a worker's trajectory, replaced by a link to ``/dev/zero`` or a named pipe:
  ``runs show`` read the link whole (a MemoryError once the address space ran out) and waited on the pipe for
  ever (``swarmyard ui`` already read them bounded, as the folder's own regular files only). Now it shows the
  run, without an audit root or steps for what is not a regular file.
- the folder copied or moved elsewhere: ``run.json`` names its store by the folder's old path, so a copy was read
  from the original's store and a moved folder's was 'gone'. Now a ``store.db`` named there is the folder's own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
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
#: The address space a command under test may take: a file read whole from ``/dev/zero`` runs out of it.
_AS_LIMIT = 2 << 30


@pytest.fixture(scope="module")
def finished_run() -> Iterator[tuple[Path, dict[str, str]]]:
    folder = Path(tempfile.mkdtemp(prefix="sy-rh-"))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    swarm = scripted_swarm(folder, agent="builtin", replies="replies.json")
    (folder / "conf" / "replies.json").write_text(json.dumps({
        "scripted-worker": [tool_call("board_post", body="a note"),
                            tool_call("submit_finding", title="market", body="Large and growing.")],
        "scripted-lead": [tool_call("submit_finding", title="synthesis", body="Go: the market is large.")],
    }))
    done = subprocess.run([str(SWARMYARD), "run", str(swarm)], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (folder / "runs").iterdir()
    yield run_dir, env
    shutil.rmtree(folder, ignore_errors=True)


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (_AS_LIMIT, _AS_LIMIT))


def _swarmyard(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SWARMYARD), *args], env=env, capture_output=True, text=True, timeout=120,
                          check=False, preexec_fn=_limited)


def _copy(run_dir: Path, runs: Path, name: str) -> Path:
    copy = runs / name
    shutil.copytree(run_dir, copy, symlinks=True, ignore=shutil.ignore_patterns("*.sock"))
    state = json.loads((copy / "run.json").read_text())
    state.update(store_url=f"sqlite:///{copy / 'store.db'}")  # the run id stays: its run.closed is found
    (copy / "run.json").write_text(json.dumps(state))
    return copy


def _files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


def _hand_made(runs: Path, name: str, store: bytes) -> Path:
    folder = runs / name
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"run_id": name, "goal_id": "goal_made_by_hand"}))
    (folder / "store.db").write_bytes(store)
    return folder


def _damaged(run_dir: Path, runs: Path) -> Path:
    copy = _copy(run_dir, runs, "damaged")
    data = (copy / "store.db").read_bytes()
    (copy / "store.db").write_bytes(data[:100] + b"\xff" * (len(data) - 100))  # SQLite's header, then no pages
    return copy


def test_a_store_that_is_no_sqlite_database_is_a_user_error_and_is_left_unchanged(
        finished_run: tuple[Path, dict[str, str]]) -> None:
    run_dir, env = finished_run
    runs = Path(tempfile.mkdtemp(prefix="sy-rh-runs-", dir=run_dir.parent.parent))
    good = _copy(run_dir, runs, "good")
    bad = [_hand_made(runs, "empty", b""), _hand_made(runs, "random", os.urandom(5000)),
           _hand_made(runs, "text", b"hello\n"), _damaged(run_dir, runs)]
    before = {folder.name: _files(folder) for folder in bad}

    listed = _swarmyard(env, "runs", "list", "--runs-dir", str(runs), "--json")
    assert listed.returncode == 0, listed.stderr[-2000:]
    rows = {row["run"]: row for row in json.loads(listed.stdout)}
    assert rows[good.name]["status"] == "done"
    for folder in bad:
        assert rows[folder.name]["status"].startswith("unreadable: "), rows[folder.name]
    for folder in bad[:3]:
        assert "not a SQLite database" in rows[folder.name]["status"], rows[folder.name]
    assert "cannot be read" in rows["damaged"]["status"], rows["damaged"]

    for folder in bad:
        shown = _swarmyard(env, "runs", "show", folder.name, "--runs-dir", str(runs))
        assert shown.returncode == 1 and "error (user_error)" in shown.stderr, (folder.name, shown.stderr)
        served = _swarmyard(env, "ui", str(folder))
        assert served.returncode == 1 and "error (user_error)" in served.stderr, (folder.name, served.stderr)
        assert "internal" not in shown.stderr + served.stderr
    for folder in bad:
        assert _files(folder) == before[folder.name], folder.name  # nothing made, nothing written
    assert (runs / "empty" / "store.db").stat().st_size == 0


def _note(folder: Path) -> Path:
    return sorted((folder / "audit" / "checkpoints").glob("*.note"))[-1]


def _trajectory(folder: Path) -> Path:
    return next((folder / "agents").glob("worker-0-*.jsonl"))


def _to_zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


def _to_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize(("name", "which", "craft"), [
    ("note-zero", _note, _to_zero),
    ("note-fifo", _note, _to_fifo),
    ("trajectory-zero", _trajectory, _to_zero),
    ("trajectory-fifo", _trajectory, _to_fifo),
])
def test_runs_show_reads_the_folder_s_own_regular_files_bounded(
        finished_run: tuple[Path, dict[str, str]], name: str, which: Callable[[Path], Path],
        craft: Callable[[Path], None]) -> None:
    run_dir, env = finished_run
    runs = Path(tempfile.mkdtemp(prefix="sy-rh-runs-", dir=run_dir.parent.parent))
    plain = _swarmyard(env, "runs", "show", _copy(run_dir, runs, "plain").name, "--runs-dir", str(runs), "--json")
    assert plain.returncode == 0, plain.stderr[-2000:]
    expected = json.loads(plain.stdout)
    assert expected["audit_root"] and any(w["steps"] > 0 for w in expected["workers"])

    copy = _copy(run_dir, runs, name)
    crafted = which(copy)
    craft(crafted)
    shown = _swarmyard(env, "runs", "show", copy.name, "--runs-dir", str(runs), "--json")
    assert shown.returncode == 0, shown.stderr[-2000:]
    info = json.loads(shown.stdout)
    assert info["status"] == "done" and info["synthesis"] == expected["synthesis"]
    if which is _note:
        assert info["audit_root"] is None
    else:
        assert info["audit_root"] == expected["audit_root"]
        worker = crafted.name.removesuffix(".jsonl").rsplit("-", 1)[-1]
        (row,) = [w for w in info["workers"] if w["id"].endswith(worker)]
        assert row["steps"] == 0


def _served_objective(env: dict[str, str], folder: Path, prefix: tuple[str, ...] = (), goal: str = "") -> str:
    """The goal's objective as ``swarmyard ui FOLDER`` serves it (``prefix``: a command that runs it; ``goal``:
    the run's goal, where this process cannot read its run.json)."""
    proc = subprocess.Popen([*prefix, str(SWARMYARD), "ui", str(folder)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        found = re.search(r"(http://\S+/ui)\b.*operator token in (.+?)\)", line)
        assert found is not None, line + proc.stderr.read() if proc.poll() is not None else line
        token = Path(found[2]).read_text().strip()
        goal = goal or json.loads((folder / "run.json").read_text())["goal_id"]
        answer = httpx.get(f"{found[1]}/api/state", params={"goal": goal},
                           headers={"Authorization": f"Bearer {token}"}, timeout=60)
        assert answer.status_code == 200, answer.text
        return str(answer.json()["goal"]["objective"])
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_a_run_folder_copied_or_moved_elsewhere_is_read_from_its_own_store(
        finished_run: tuple[Path, dict[str, str]]) -> None:
    """run.json names the store by the path the folder had when it ran: a copy read the original's store, and
    once the original was gone, ``runs list``, ``runs show`` and ``ui`` said the store 'is gone'."""
    run_dir, env = finished_run
    elsewhere = Path(tempfile.mkdtemp(prefix="sy-rh-moved-", dir=run_dir.parent.parent))
    copy = elsewhere / run_dir.name
    shutil.copytree(run_dir, copy, symlinks=True, ignore=shutil.ignore_patterns("*.sock"))
    assert json.loads((copy / "run.json").read_text())["store_url"] == f"sqlite:///{run_dir / 'store.db'}"
    with sqlite3.connect(copy / "store.db") as db:  # the copy's own store says so
        db.execute("UPDATE goals SET objective = 'the copy'")
    db.close()

    shown = _swarmyard(env, "runs", "show", copy.name, "--runs-dir", str(elsewhere), "--json")
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert json.loads(shown.stdout)["objective"] == "the copy"
    assert _served_objective(env, copy) == "the copy"

    moved = Path(tempfile.mkdtemp(prefix="sy-rh-moved-", dir=run_dir.parent.parent)) / "renamed"
    copy.rename(moved)  # another name, and the path run.json names is the original's: gone once it is moved
    with sqlite3.connect(moved / "store.db") as db:
        db.execute("UPDATE goals SET objective = 'moved'")
    db.close()
    state = json.loads((moved / "run.json").read_text())
    state.update(store_url=f"sqlite:///{elsewhere / 'gone' / 'store.db'}")
    (moved / "run.json").write_text(json.dumps(state))
    listed = _swarmyard(env, "runs", "list", "--runs-dir", str(moved.parent), "--json")
    assert listed.returncode == 0, listed.stderr[-2000:]
    (row,) = json.loads(listed.stdout)
    assert row["status"] == "done" and row["objective"] == "moved", row
    assert _served_objective(env, moved) == "moved"


#: Runs a command in a mount namespace of its own where $RO is $SRC mounted read-only.
_READ_ONLY = ("unshare", "-m", "sh", "-c", 'mount --bind "$SRC" "$RO" && mount -o remount,bind,ro "$RO" && exec "$@"',
              "read-only")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare: a read-only bind mount of the runs folder")
def test_a_run_folder_this_process_cannot_write_is_read(finished_run: tuple[Path, dict[str, str]]) -> None:
    """A runs folder on a read-only file system (or another user's, readable only): SQLite's WAL mode needs its
    -shm file beside the store, so ``swarmyard ui`` ended in 'error (internal): OperationalError: unable to
    open database file'. It is now read as immutable, and nothing is made there."""
    run_dir, env = finished_run
    source = Path(tempfile.mkdtemp(prefix="sy-rh-ro-", dir=run_dir.parent.parent))
    copy = _copy(run_dir, source, "archived")
    with sqlite3.connect(copy / "store.db") as db:
        db.execute("UPDATE goals SET objective = 'archived'")
    db.close()
    mount = Path(tempfile.mkdtemp(prefix="sy-rh-mnt-", dir=run_dir.parent.parent))
    before = _files(copy)
    ro_env = {**env, "SRC": str(source), "RO": str(mount)}

    shown = subprocess.run([*_READ_ONLY, str(SWARMYARD), "runs", "show", "archived", "--runs-dir", str(mount),
                            "--json"], env=ro_env, capture_output=True, text=True, timeout=120, check=False)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert json.loads(shown.stdout)["objective"] == "archived"
    goal = json.loads((copy / "run.json").read_text())["goal_id"]
    assert _served_objective(ro_env, mount / "archived", _READ_ONLY, goal) == "archived"
    assert _files(copy) == before
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in run_dir.iterdir()
                                                            if not p.name.endswith(".sock"))


def test_a_trajectory_line_nested_past_the_parser_is_skipped(finished_run: tuple[Path, dict[str, str]]) -> None:
    """A trajectory line nested deeper than the JSON parser goes (no agent writes one: the plane bounds what
    it keeps) ended ``swarmyard ui`` in 'error (internal): RecursionError' before it served; it is a line that
    does not parse, skipped like one."""
    run_dir, env = finished_run
    runs = Path(tempfile.mkdtemp(prefix="sy-rh-runs-", dir=run_dir.parent.parent))
    copy = _copy(run_dir, runs, "nested")
    path = _trajectory(copy)
    steps = len(path.read_bytes().splitlines())
    with path.open("a") as out:
        out.write("[" * 200_000 + "]" * 200_000 + "\n")
    worker = path.name.removesuffix(".jsonl").rsplit("-", 1)[-1]
    proc = subprocess.Popen([str(SWARMYARD), "ui", str(copy)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        found = re.search(r"(http://\S+/ui)\b.*operator token in (.+?)\)", line)
        assert found is not None, line + proc.stderr.read() if proc.poll() is not None else line
        token = Path(found[2]).read_text().strip()
        answer = httpx.get(f"{found[1]}/api/trajectory/{worker}", headers={"Authorization": f"Bearer {token}"},
                           timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["steps_total"] == steps
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
