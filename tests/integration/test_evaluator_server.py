"""`swarmyard evaluator serve` as a real process on a real Unix socket: its own user, a locked bundle, signed
scores over HTTP, a holdout that stays spent across a restart, and typed errors on the client."""

from __future__ import annotations

import asyncio
import base64
import errno
import json
import os
import pwd
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from swarmyard.cli.evaluator import app
from swarmyard.errors import (
    EvaluatorUnavailableError,
    ForbiddenError,
    HoldoutUsedError,
    InvalidInputError,
    PayloadTooLargeError,
)
from swarmyard.evaluator.client import AsyncEvaluatorClient, EvaluatorClient
from swarmyard.evaluator.identity import EVAL_USER
from swarmyard.evaluator.score import verify_score

pytestmark = [pytest.mark.bwrap,
              pytest.mark.skipif(os.geteuid() != 0, reason="serve's user switch needs root")]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "bundles" / "sort-numbers"
GOOD_SORT = b"import sys\nprint(' '.join(map(str, sorted(map(int, sys.stdin.read().split())))))\n"
# the evaluator noun on its own, so these tests do not depend on the other nouns of the CLI
CLI = "from swarmyard.cli import render; from swarmyard.cli.evaluator import app; render.run_app(app)"
CHILD_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}


@dataclass
class Served:
    proc: subprocess.Popen[str]
    ready: dict[str, Any]
    root: Path

    @property
    def source(self) -> Path:
        """The bundle folder serve was given (only ever read)."""
        return self.root / "bundle"

    @property
    def bundle(self) -> Path:
        """The evaluator's protected copy of it."""
        return self.state / "bundle"

    @property
    def socket(self) -> Path:
        return self.root / "eval.sock"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def public_key(self) -> bytes:
        return base64.b64decode(self.ready["public_key"])


def start(root: Path, *extra: str) -> Served:
    """Start ``serve`` on ``root``/bundle and wait (bounded) for its ready line."""
    argv = [sys.executable, "-c", CLI, "serve", str(root / "bundle"), "--socket", str(root / "eval.sock"),
            "--state", str(root / "state"), *extra]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=CHILD_ENV)
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout=30):
            proc.kill()
            pytest.fail("serve did not become ready within 30 s")
    line = proc.stdout.readline()
    if not line:
        proc.wait()
        pytest.fail(f"serve exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
    return Served(proc=proc, ready=json.loads(line), root=root)


def stop(served: Served) -> None:
    served.proc.send_signal(signal.SIGTERM)
    try:
        served.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        served.proc.kill()
        served.proc.wait()


@pytest.fixture(scope="module")
def open_root() -> Iterator[Path]:
    """A folder every user can search (tmp_path is root-only), so only the bundle's own modes protect it."""
    root = Path(tempfile.mkdtemp(prefix="swarmyard-eval-test-"))
    root.chmod(0o755)
    shutil.copytree(EXAMPLE, root / "bundle")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def served(open_root: Path) -> Iterator[Served]:
    running = start(open_root)
    yield running
    stop(running)


def test_serve_runs_as_its_own_user_and_locks_the_bundle(served: Served) -> None:
    user = pwd.getpwnam(EVAL_USER)
    assert served.ready["user"] == EVAL_USER
    status = Path(f"/proc/{served.proc.pid}/status").read_text()
    uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
    gids = next(line for line in status.splitlines() if line.startswith("Gid:")).split()[1:]
    assert uids == [str(user.pw_uid)] * 4
    assert gids == [str(user.pw_gid)] * 4
    for path in [served.bundle, *served.bundle.rglob("*"), served.state]:
        info = path.stat()
        assert info.st_uid == user.pw_uid, path
        assert info.st_mode & 0o777 == (0o700 if path.is_dir() else 0o600), path
    sock = served.socket.stat()
    assert sock.st_mode & 0o777 == 0o660
    assert (sock.st_uid, sock.st_gid) == (0, user.pw_gid)


def _modes(root: Path) -> dict[str, tuple[int, int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_uid, p.stat().st_gid, p.stat().st_mode)
            for p in [root, *root.rglob("*")]}


def test_serve_copies_the_bundle_and_never_changes_the_folder_it_was_given() -> None:
    # the regression: serve once chowned and chmodded the folder it was given, which broke a checkout it ran on
    root = Path(tempfile.mkdtemp(prefix="swarmyard-eval-source-"))
    root.chmod(0o755)
    shutil.copytree(EXAMPLE, root / "bundle")
    before = _modes(root / "bundle")
    assert before["score.py"][2] & 0o777 == 0o644
    try:
        running = start(root)
        try:
            assert _modes(root / "bundle") == before
            copy = root / "state" / "bundle"
            assert (copy / "score.py").read_bytes() == (root / "bundle" / "score.py").read_bytes()
            assert (copy / "score.py").stat().st_uid == pwd.getpwnam(EVAL_USER).pw_uid
            with EvaluatorClient(running.socket) as client:
                assert client.score("goal_copy", GOOD_SORT).score == 5
            # an edit of the folder after the start changes nothing the evaluator scores with
            (root / "bundle" / "search" / "cases.json").write_text("[[3, 1, 2]]")
            with EvaluatorClient(running.socket) as client:
                assert client.score("goal_copy", GOOD_SORT).score == 5
        finally:
            stop(running)
        assert _modes(root / "bundle") == {**before, "search/cases.json": _modes(root / "bundle")["search/cases.json"]}
        again = start(root)  # a restart takes a fresh copy of the folder as it is now
        try:
            with EvaluatorClient(again.socket) as client:
                assert client.score("goal_copy", GOOD_SORT).score == 1
        finally:
            stop(again)
        assert _modes(root / "bundle")["score.py"] == before["score.py"]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_an_evaluator_bound_to_a_goal_refuses_every_other_goal() -> None:
    root = Path(tempfile.mkdtemp(prefix="swarmyard-eval-goal-"))
    root.chmod(0o755)
    shutil.copytree(EXAMPLE, root / "bundle")
    try:
        running = start(root, "--goal", "goal_mine")
        try:
            assert running.ready["goal"] == "goal_mine"
            with EvaluatorClient(running.socket) as client:
                assert client.score("goal_mine", GOOD_SORT).score == 5
                with pytest.raises(ForbiddenError):
                    client.score("goal_other", GOOD_SORT)
                with pytest.raises(ForbiddenError):
                    client.final_holdout("goal_other", GOOD_SORT)
                assert client.final_holdout("goal_mine", GOOD_SORT).score == 5
                with pytest.raises(HoldoutUsedError):
                    client.final_holdout("goal_mine", GOOD_SORT)
        finally:
            stop(running)
    finally:
        shutil.rmtree(root, ignore_errors=True)


PROBE = """
import errno, json, os, socket, sys
out = {}
for path in sys.argv[1:-1]:
    try:
        os.open(path, os.O_RDONLY)
        out[path] = 0
    except OSError as exc:
        out[path] = exc.errno
try:
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[-1])
    out["socket"] = 0
except OSError as exc:
    out["socket"] = exc.errno
print(json.dumps(out))
"""


def test_another_user_cannot_read_the_bundle_or_reach_the_socket(served: Served) -> None:
    control = served.root / "readable.txt"
    control.write_text("anyone may read this")
    control.chmod(0o644)
    secrets_ = [served.bundle / "evaluator.toml", served.bundle / "holdout" / "cases.json", served.bundle,
                served.bundle / "holdout", served.state / "evaluator.key"]
    probe = ["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", PROBE,
             str(control), *map(str, secrets_), str(served.socket)]
    done = subprocess.run(probe, capture_output=True, text=True, env=CHILD_ENV, check=True, timeout=30)
    result = json.loads(done.stdout)
    assert result.pop(str(control)) == 0  # the parent folder is open: the refusals below are the bundle's own
    assert result == {**{str(p): errno.EACCES for p in secrets_}, "socket": errno.EACCES}


def test_a_worker_sandbox_that_sees_the_whole_host_still_cannot_read_the_bundle(served: Served) -> None:
    # the worst case of a worker machine: the host's whole tree mounted inside, run as an unprivileged user
    secrets_ = [served.bundle / "evaluator.toml", served.bundle / "search" / "cases.json",
                served.state / "evaluator.key"]
    probe = ["runuser", "-u", "nobody", "--", "bwrap", "--unshare-all", "--die-with-parent",
             "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--", "/usr/bin/python3", "-c", PROBE,
             *map(str, secrets_), str(served.socket)]
    done = subprocess.run(probe, capture_output=True, text=True, env=CHILD_ENV, check=True, timeout=30)
    result = json.loads(done.stdout)
    assert {k: v for k, v in result.items() if k != "socket"} == {str(p): errno.EACCES for p in secrets_}
    assert result["socket"] != 0


def test_scores_over_the_socket_verify_with_the_published_key(served: Served, tmp_path: Path) -> None:
    with EvaluatorClient(served.socket) as client:
        assert client.public_key() == served.public_key
        good = client.score("goal_http", GOOD_SORT)
        bad = client.score("goal_http", b"print(0)\n")
    assert (good.score, bad.score) == (5, 0)
    assert verify_score(good, served.public_key)
    score_file = tmp_path / "score.json"
    score_file.write_text(json.dumps(good.to_dict()))
    key = served.ready["public_key"]
    verified = CliRunner().invoke(app, ["verify", str(score_file), "--public-key", key])
    assert verified.exit_code == 0, verified.output
    score_file.write_text(json.dumps({**good.to_dict(), "score": 6}))
    assert CliRunner().invoke(app, ["verify", str(score_file), "--public-key", key]).exit_code == 1


def test_the_async_client(served: Served) -> None:
    async def go() -> tuple[int, bytes]:
        async with AsyncEvaluatorClient(served.socket) as client:
            signed = await client.score("goal_async", GOOD_SORT)
            return signed.score, await client.public_key()

    value, key = asyncio.run(go())
    assert (value, key) == (5, served.public_key)


def test_errors_arrive_typed(served: Served, tmp_path: Path) -> None:
    with EvaluatorClient(served.socket) as client:
        with pytest.raises(PayloadTooLargeError) as large:
            client.score("goal_err", b"x" * 70_000)
        assert large.value.limit == 65536
        with pytest.raises(InvalidInputError) as bad_goal:
            client.score("../etc", GOOD_SORT)
        assert bad_goal.value.field == "goal"
        with pytest.raises(InvalidInputError) as bad_split:
            client.score("goal_err", GOOD_SORT, split="holdout")
        assert bad_split.value.field == "split"
    nowhere = EvaluatorClient(tmp_path / "nobody-listens.sock")
    with nowhere, pytest.raises(EvaluatorUnavailableError):
        nowhere.score("goal_err", GOOD_SORT)


def test_a_second_server_on_the_same_socket_is_refused(served: Served) -> None:
    argv = [sys.executable, "-c", CLI, "serve", str(served.source), "--socket", str(served.socket),
            "--state", str(served.root / "state2")]
    done = subprocess.run(argv, capture_output=True, text=True, env=CHILD_ENV, timeout=60)
    assert done.returncode == 1
    assert "already serving" in done.stderr
    with EvaluatorClient(served.socket) as client:  # the first one still answers
        assert client.public_key() == served.public_key


def test_a_malformed_bundle_stops_serve_naming_the_field(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(EXAMPLE, bundle)
    manifest = "name = 'x'\n[scoring]\nentry = 'score.py'\n[limits]\ncpu_s = -1\n"
    (bundle / "evaluator.toml").write_text(manifest)
    argv = [sys.executable, "-c", CLI, "serve", str(bundle), "--socket", str(tmp_path / "s.sock"),
            "--state", str(tmp_path / "state")]
    done = subprocess.run(argv, capture_output=True, text=True, env=CHILD_ENV, timeout=60)
    assert done.returncode == 1
    assert "limits.cpu_s" in done.stderr
    assert not (tmp_path / "s.sock").exists()
    assert (bundle / "evaluator.toml").stat().st_uid == os.getuid()  # nothing was handed over


def test_a_state_folder_holding_other_files_is_refused(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(EXAMPLE, bundle)
    state = tmp_path / "not-state"
    state.mkdir()
    (state / "notes.txt").write_text("someone else's file")
    argv = [sys.executable, "-c", CLI, "serve", str(bundle), "--socket", str(tmp_path / "s.sock"),
            "--state", str(state)]
    done = subprocess.run(argv, capture_output=True, text=True, env=CHILD_ENV, timeout=60)
    assert done.returncode == 1
    assert "notes.txt" in done.stderr
    assert (state / "notes.txt").stat().st_uid == os.getuid()
    assert (bundle / "evaluator.toml").stat().st_uid == os.getuid()


def test_the_holdout_stays_spent_after_a_server_restart() -> None:
    root = Path(tempfile.mkdtemp(prefix="swarmyard-eval-restart-"))
    root.chmod(0o755)
    shutil.copytree(EXAMPLE, root / "bundle")
    try:
        first = start(root)
        try:
            with EvaluatorClient(first.socket) as client:
                signed = client.final_holdout("goal_once", GOOD_SORT)
                assert (signed.split, signed.score) == ("holdout", 5)
                assert verify_score(signed, first.public_key)
                with pytest.raises(HoldoutUsedError):
                    client.final_holdout("goal_once", GOOD_SORT)
        finally:
            stop(first)
        assert first.proc.returncode is not None
        started = time.monotonic()
        second = start(root)
        try:
            assert second.proc.pid != first.proc.pid
            assert second.public_key == first.public_key  # same key, kept in the state folder
            with EvaluatorClient(second.socket) as client:
                with pytest.raises(HoldoutUsedError) as caught:
                    client.final_holdout("goal_once", b"print('a different artifact')\n")
                assert caught.value.goal_id == "goal_once"
                assert client.final_holdout("goal_other", GOOD_SORT).score == 5
        finally:
            stop(second)
        assert time.monotonic() - started < 60
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_bad_goal_stops_serve_before_anything_changes(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(EXAMPLE, bundle)
    argv = [sys.executable, "-c", CLI, "serve", str(bundle), "--socket", str(tmp_path / "s.sock"),
            "--state", str(tmp_path / "state"), "--goal", "../not-a-goal"]
    done = subprocess.run(argv, capture_output=True, text=True, env=CHILD_ENV, timeout=60)
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "invalid_input" in lines[0] and "goal" in lines[0], done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]  # no state, no copy, no socket
