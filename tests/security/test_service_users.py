"""Started as root, the control plane, the evaluator and the witness run as three system users, and the plane's
user cannot open the evaluator's protected bundle or key, nor the witness's key or state.

Each service is started through its console script (``swarmyard serve``, ``swarmyard evaluator serve``,
``swarmyard witness serve --home``) as root, the way a host's operator starts them; which user each runs as is
read from ``/proc/PID/status``, and what the plane's user can open is tried with ``cat`` under exactly the
plane process's credentials (its uid, gid and supplementary groups, no capabilities). The plane still serves,
and still writes its store, after the switch.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from swarmyard.identity import EVAL_USER, PLANE_USER, WITNESS_USER, ensure_system_user

SWARMYARD = Path(sys.executable).with_name("swarmyard")
BUNDLE = Path(__file__).resolve().parents[2] / "examples" / "bundles" / "sort-numbers"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the services switch to their own users")


@pytest.fixture
def home() -> Iterator[Path]:
    """A throwaway folder the services' users may pass through (0711), with a folder of the plane's own."""
    path = Path(tempfile.mkdtemp(prefix="sy-u-"))
    path.chmod(0o711)
    plane = ensure_system_user(PLANE_USER)
    (path / "plane").mkdir(mode=0o700)
    os.chown(path / "plane", plane.uid, plane.gid)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(home: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
            "SWARMYARD_STATE_DIR": str(home / "state")}


def _start(home: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([str(SWARMYARD), *args], cwd=home, env=_env(home), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def _ready(proc: subprocess.Popen[str]) -> dict[str, object]:
    """The service's JSON ready line (its stdout's first line; empty if it exited)."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr else ""
    data = json.loads(line)
    assert isinstance(data, dict)
    return data


def _stderr_until(proc: subprocess.Popen[str], marker: str) -> str:
    """The service's stderr lines up to the one holding ``marker`` (or to its end, if it exited first)."""
    assert proc.stderr is not None
    seen = ""
    for line in proc.stderr:
        seen += line
        if marker in line:
            break
    return seen


def _status(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = value.strip()
    return fields


def _open_as(status: dict[str, str], path: Path) -> subprocess.CompletedProcess[str]:
    """``cat PATH`` with exactly the credentials of the process whose status this is."""
    uid, gid = int(status["Uid"].split()[0]), int(status["Gid"].split()[0])
    groups = [int(g) for g in status["Groups"].split()]
    return subprocess.run(["/bin/cat", str(path)], user=uid, group=gid, extra_groups=groups, capture_output=True,
                          text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})


def _curl_as(status: dict[str, str], sock: Path, path: str) -> subprocess.CompletedProcess[str]:
    """``curl`` over a Unix socket with exactly the credentials of the process whose status this is."""
    uid, gid = int(status["Uid"].split()[0]), int(status["Gid"].split()[0])
    groups = [int(g) for g in status["Groups"].split()]
    return subprocess.run(["curl", "-sS", "--unix-socket", str(sock), f"http://local{path}"], user=uid, group=gid,
                          extra_groups=groups, capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})


def test_started_as_root_the_plane_cannot_read_the_evaluators_bundle_or_the_witness_key(home: Path) -> None:
    procs = [
        _start(home, "witness", "serve", "--home", str(home / "witness"), "--socket", str(home / "w.sock")),
        _start(home, "evaluator", "serve", str(BUNDLE), "--socket", str(home / "e.sock"), "--state",
               str(home / "eval")),
    ]
    try:
        witness, evaluator = _ready(procs[0]), _ready(procs[1])
        procs.append(_start(home, "serve", "--store", f"sqlite:///{home / 'plane' / 'store.db'}", "--socket",
                            str(home / "plane.sock"), "--evaluator-socket", str(home / "e.sock"),
                            "--operator-token-file", str(home / "operator-token"),
                            "--audit-dir", str(home / "plane" / "audit"), "--witness", str(home / "w.sock")))
        said = _stderr_until(procs[2], "serving as")
        assert f"serving as {PLANE_USER}" in said, said

        users = {name: pwd.getpwnam(name).pw_uid for name in (PLANE_USER, EVAL_USER, WITNESS_USER)}
        assert len(set(users.values())) == 3 and 0 not in users.values()
        statuses = [_status(p.pid) for p in procs]
        for status, name in zip(statuses, (WITNESS_USER, EVAL_USER, PLANE_USER), strict=True):
            assert status["Uid"].split() == [str(users[name])] * 4, (name, status["Uid"])
            assert int(status["CapEff"], 16) == 0, (name, status["CapEff"])  # no root capability kept
        assert (witness["user"], evaluator["user"]) == (WITNESS_USER, EVAL_USER)
        plane = statuses[2]

        secrets = [home / "witness" / "private" / "witness.key", home / "witness" / "private" / "state.json",
                   home / "eval" / "evaluator.key", home / "eval" / "bundle" / "holdout" / "cases.json",
                   home / "eval" / "bundle" / "evaluator.toml"]
        for path in secrets:
            assert path.exists() or path.name == "state.json", path  # the state file comes with a first cosign
            tried = _open_as(plane, path)
            assert tried.returncode != 0 and "Permission denied" in tried.stderr, (path, tried)
        for folder, name in ((home / "witness" / "private", WITNESS_USER), (home / "eval", EVAL_USER)):
            info = folder.stat()
            assert (info.st_uid, info.st_mode & 0o777) == (users[name], 0o700), folder
        # what the plane may read it reads with the same credentials: the check above can fail
        public = _open_as(plane, home / "witness" / "public" / "witness.vkey")
        assert public.returncode == 0 and public.stdout.strip() == witness["vkey"], public

        # yet its credentials still open the evaluator's and the witness's sockets (their groups, 0660)
        assert json.loads(_curl_as(plane, home / "e.sock", "/v1/health").stdout)["ok"] is True
        assert _curl_as(plane, home / "w.sock", "/key").stdout.strip() == witness["vkey"]

        # the plane serves and writes its store as its own user
        transport = httpx.HTTPTransport(uds=str(home / "plane.sock"))
        with httpx.Client(transport=transport, base_url="http://plane", timeout=30) as client:
            assert client.get("/healthz").status_code == 200
        made = subprocess.run([str(SWARMYARD), "goal", "create", "owned by the plane's user", "--budget-usd", "1",
                               "--call-cap", "3", "--server", str(home / "plane.sock"), "--operator-token-file",
                               str(home / "operator-token")], env=_env(home), capture_output=True, text=True,
                              timeout=120)
        assert made.returncode == 0 and made.stdout.startswith("goal_"), made.stderr
        assert (home / "plane" / "store.db").stat().st_uid == users[PLANE_USER]

        # stopped, the plane signs its log's last checkpoint and has the witness cosign it (through its group);
        # the store's log then verifies against the witness's home with no other flag
        _stop(procs[2:])
        assert procs[2].returncode == 0, procs[2].stderr
        verified = subprocess.run([str(SWARMYARD), "audit", "verify", str(home / "plane" / "audit"), "--store",
                                   f"sqlite:///{home / 'plane' / 'store.db'}", "--witness-home", str(home / "witness")],
                                  env=_env(home), capture_output=True, text=True, timeout=120)
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert "witness key pinned; not rolled back below" in verified.stdout
        assert f"witness home {home / 'witness'} ({WITNESS_USER})" in verified.stderr
    finally:
        _stop(procs)


def test_a_plane_whose_folders_its_user_cannot_write_stays_root_and_says_so(home: Path) -> None:
    root_only = home / "root-only"
    root_only.mkdir(mode=0o700)
    proc = _start(home, "serve", "--store", f"sqlite:///{root_only / 'store.db'}", "--socket",
                  str(home / "plane.sock"), "--operator-token-file", str(home / "operator-token"))
    try:
        said = _stderr_until(proc, "warning")
        assert f"serving as root, not as {PLANE_USER}: {root_only} is not" in said, said
        assert _status(proc.pid)["Uid"].split()[0] == "0"
    finally:
        _stop([proc])


def _post_as(status: dict[str, str], sock: Path, path: str, body: str, *headers: str) -> subprocess.CompletedProcess[str]:
    """``curl -X POST`` over a Unix socket with exactly the credentials of the process whose status this is."""
    uid, gid = int(status["Uid"].split()[0]), int(status["Gid"].split()[0])
    groups = [int(g) for g in status["Groups"].split()]
    argv = ["curl", "-sS", "--unix-socket", str(sock), "--data-binary", "@-", f"http://local{path}"]
    for header in headers:
        argv[1:1] = ["-H", header]
    return subprocess.run(argv, input=body, user=uid, group=gid, extra_groups=groups, capture_output=True, text=True,
                          timeout=30, env={"PATH": "/usr/bin:/bin"})


def _forge(plane: Path, origin: str) -> str:
    """What the plane's user can do to its own files: rewrite a goal in its row and its event, then rebuild the
    leaves and sign the one checkpoint with a fresh key under ``origin``; returns the checkpoint note."""
    import sqlite3

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from swarmyard.audit.checkpoint import Checkpoint
    from swarmyard.audit.log import checkpoint_path, list_checkpoints
    from swarmyard.audit.note import Signer, sign_note
    from swarmyard.audit.tree import MerkleTree

    with sqlite3.connect(plane / "store.db") as db:
        db.execute("UPDATE events SET body = CAST(replace(CAST(body AS TEXT), 'owned by the plane''s user', "
                   "'FORGED by the plane''s user') AS BLOB) WHERE kind = 'goal.created'")
        db.execute("UPDATE goals SET objective = 'FORGED by the plane''s user'")
        bodies = [bytes(b) for (b,) in db.execute("SELECT body FROM events WHERE leaf_index IS NOT NULL "
                                                  "ORDER BY leaf_index")]
    audit = plane / "audit"
    signer = Signer(origin, Ed25519PrivateKey.generate())
    (audit / "log.vkey").write_text(signer.verifier.vkey + "\n")
    tree = MerkleTree()
    for body in bodies:
        tree.append(body)
    (audit / "leaves").write_bytes(b"".join(tree.leaf_hash(i) for i in range(tree.size)))
    for path in list_checkpoints(audit):
        path.unlink()
    note = sign_note(Checkpoint(origin, tree.size, tree.root()).body, [signer]).render()
    checkpoint_path(audit, 1).write_text(note)
    return note


def test_the_plane_cannot_pass_off_a_log_it_forged_and_had_cosigned_as_a_new_log(home: Path) -> None:
    """The plane's user holds its store and its audit folder (the log key too) and reaches the witness's socket:
    it can rewrite history, sign it with a fresh key under an origin of its choosing and have the witness cosign
    that as a log it has never seen. ``audit verify`` of the folder must still fail: the origin it expects is
    fixed by the folder's place, not by the folder's files."""
    witness = _start(home, "witness", "serve", "--home", str(home / "witness"), "--socket", str(home / "w.sock"))
    procs = [witness]
    try:
        _ready(witness)
        store = f"sqlite:///{home / 'plane' / 'store.db'}"
        procs.append(_start(home, "serve", "--store", store, "--socket", str(home / "plane.sock"),
                            "--operator-token-file", str(home / "operator-token"),
                            "--audit-dir", str(home / "plane" / "audit"), "--witness", str(home / "w.sock")))
        assert f"serving as {PLANE_USER}" in _stderr_until(procs[1], "serving as")
        plane = _status(procs[1].pid)
        made = subprocess.run([str(SWARMYARD), "goal", "create", "owned by the plane's user", "--budget-usd", "1",
                               "--call-cap", "3", "--server", str(home / "plane.sock"), "--operator-token-file",
                               str(home / "operator-token")], env=_env(home), capture_output=True, text=True,
                              timeout=120)
        assert made.returncode == 0, made.stderr
        _stop(procs[1:])

        def verify(*flags: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([str(SWARMYARD), "audit", "verify", str(home / "plane" / "audit"), "--store", store,
                                   "--witness-home", str(home / "witness"), *flags], env=_env(home),
                                  capture_output=True, text=True, timeout=120)

        honest = verify()
        assert honest.returncode == 0, honest.stdout + honest.stderr
        assert "log key the witness cosigned; witness key pinned; not rolled back below" in honest.stdout
        # everything the forgery writes is the plane's user's to write
        uid = int(plane["Uid"].split()[0])
        for path in (home / "plane" / "store.db", home / "plane" / "audit", home / "plane" / "audit" / "log.key"):
            assert path.stat().st_uid == uid, path

        # under an origin of its own: the witness takes it as a new log and cosigns it
        note = _forge(home / "plane", "swarmyard.serve/log_forged")
        vkey = (home / "plane" / "audit" / "log.vkey").read_text().strip()
        cosigned = _post_as(plane, home / "w.sock", "/add-checkpoint", f"old 0\n\n{note}",
                            f"x-swarmyard-log-key: {vkey}")
        assert cosigned.returncode == 0 and cosigned.stdout.startswith("\u2014 swarmyard-witness "), cosigned
        checkpoint = home / "plane" / "audit" / "checkpoints" / "000001.note"
        checkpoint.write_text(note + cosigned.stdout.rstrip("\n") + "\n")
        shutil.copy(home / "witness" / "public" / "witness.vkey", home / "plane" / "audit" / "witness.vkey")
        # the forgery is otherwise whole: named as the log it claims to be, it verifies (the check below can fail)
        claimed = verify("--origin", "swarmyard.serve/log_forged")
        assert claimed.returncode == 0 and "FORGED" not in claimed.stdout, claimed.stdout + claimed.stderr
        forged = verify()
        assert forged.returncode == 1, forged.stdout + forged.stderr
        assert forged.stdout.startswith("BAD origin 0: the log is 'swarmyard.serve/log_forged', not "
                                        f"'swarmyard.serve{(home / 'plane' / 'audit').resolve()}'"), forged.stdout
        # nor with its witness key gone (as if made without a witness), nor with no witness home to read
        (home / "plane" / "audit" / "witness.vkey").unlink()
        assert verify().stdout.startswith("BAD origin 0:")

        # under the folder's own origin with a fresh key: the witness refuses, and verify names the key
        origin = f"swarmyard.serve{(home / 'plane' / 'audit').resolve()}"
        note = _forge(home / "plane", origin)
        vkey = (home / "plane" / "audit" / "log.vkey").read_text().strip()
        refused = _post_as(plane, home / "w.sock", "/add-checkpoint", f"old 0\n\n{note}",
                           f"x-swarmyard-log-key: {vkey}")
        assert "the log's key differs from the one pinned for this origin" in refused.stdout, refused
        again = verify()
        assert again.returncode == 1 and again.stdout.startswith(
            "BAD witnessed 0: not a checkpoint signed by this log's key"), again.stdout
    finally:
        _stop(procs)
