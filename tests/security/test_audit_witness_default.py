"""A default ``swarmyard run`` is cosigned by a witness of its own, and ``swarmyard audit verify RUN`` with no
flag catches what only a witness can: a log cut back to an earlier cosigned checkpoint, and a log rewritten and
re-signed with the run's own log key (which whoever holds the plane's files has). A ``--no-witness`` run verifies
and says what it cannot detect.

Real ``swarmyard run`` processes (the console script, bubblewrap machines, the scripted provider), each with its
embedded witness, started as this host's user (root here: the witness then runs as ``swarmyard-witness``). The
witness home is a folder of the test's (``SWARMYARD_WITNESS_DIR``), so tests do not share one. The forgeries are
what an attacker holding the run folder, the store and the log key would write; verdicts come only from the
command's exit code and output.
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from rigs.swarm_files import scripted_swarm
from swarmyard.audit.checkpoint import Checkpoint, read_checkpoint
from swarmyard.audit.log import checkpoint_path, list_checkpoints
from swarmyard.audit.note import Signer, Verifier, sign_note
from swarmyard.audit.tree import MerkleTree

SWARMYARD = Path(sys.executable).with_name("swarmyard")

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]


def sy(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The console script in a clean environment whose witness home and state folder are the test's."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
           "SWARMYARD_STATE_DIR": str(home / "state"), "SWARMYARD_WITNESS_DIR": str(home / "witness")}
    return subprocess.run([str(SWARMYARD), *args], cwd=home, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def home() -> Iterator[Path]:
    """A short throwaway folder; 0711 so that the witness's own user can reach its home inside it."""
    path = Path(tempfile.mkdtemp(prefix="sy-w-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _swarm(home: Path) -> Path:
    conf = home / "conf"
    (conf / "replies").mkdir(parents=True)
    def finding(title: str, body: str) -> dict[str, object]:
        return {"tool_calls": [{"name": "submit_finding", "arguments": {"title": title, "body": body}}]}

    (conf / "replies" / "answers.json").write_text(json.dumps({
        "scripted-worker": [finding("market", "Large and growing.")], "scripted-lead": [finding("synthesis", "Go.")]}))
    return scripted_swarm(home)


def _run(home: Path, *flags: str) -> Path:
    done = sy(home, "run", str(_swarm(home)), "--quiet", *flags)
    assert done.returncode == 0, done.stderr[-3000:]
    [run] = (home / "runs").iterdir()
    return run


def _sql(run: Path, statement: str, *params: object) -> None:
    with sqlite3.connect(run / "store.db") as db:
        db.execute(statement, params)


def _size(run: Path, number: int) -> int:
    return read_checkpoint(checkpoint_path(run / "audit", number).read_text()).checkpoint.size


def _bad(done: subprocess.CompletedProcess[str], prefix: str) -> None:
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert done.stdout.startswith(f"BAD {prefix}"), done.stdout
    assert "Traceback" not in done.stderr


def test_a_default_run_rolled_back_to_an_earlier_cosigned_checkpoint_fails_verify_with_no_flags(home: Path) -> None:
    run = _run(home)
    resumed = sy(home, "run", str(home / "conf" / "swarm.toml"), "--resume", run.name, "--quiet")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    notes = list_checkpoints(run / "audit")
    assert len(notes) == 2 and all("\u2014 swarmyard-witness " in n.read_text() for n in notes)  # both cosigned
    ok = sy(home, "audit", "verify", str(run))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    cosigned = _size(run, 2)
    assert f"log key the witness cosigned; witness key pinned; not rolled back below {cosigned}" in ok.stdout
    saved = sy(home, "witness", "checkpoint", f"swarmyard.local/{run.name}", "--home", str(home / "witness"))
    assert saved.returncode == 0 and saved.stdout == checkpoint_path(run / "audit", 2).read_text()

    # cut back to checkpoint 1, every trace of the later events gone: a log as it stood then, cosigned then
    first = _size(run, 1)
    _sql(run, "DELETE FROM events WHERE leaf_index >= ?", first)
    checkpoint_path(run / "audit", 2).unlink()
    leaves = run / "audit" / "leaves"
    leaves.write_bytes(leaves.read_bytes()[:first * 32])
    pinned = sy(home, "audit", "verify", str(run), "--no-witness",
                "--log-key", (run / "audit" / "log.vkey").read_text().strip())
    assert pinned.returncode == 0, pinned.stdout  # the log alone, even with its key pinned, cannot tell
    _bad(sy(home, "audit", "verify", str(run)),
         f"event {first}: missing: the witness cosigned {cosigned} events and the log holds {first} (rolled back)")


def _resign(home: Path, run: Path, *, fresh_key: bool = False, origin: str | None = None) -> None:
    """Rebuild the leaves from the store's events and sign every checkpoint again, as the holder of the log key
    (or of a fresh one) would, under the log's origin or ``origin``: the witness's cosignatures cannot be made,
    so they go, and its key with them (the folder then looks like a --no-witness run's)."""
    (run / "audit" / "witness.vkey").unlink(missing_ok=True)
    origin = origin or Verifier.parse((run / "audit" / "log.vkey").read_text().strip()).name
    if fresh_key:
        key = Ed25519PrivateKey.generate()
    else:
        key = Ed25519PrivateKey.from_private_bytes((home / "state" / "runs" / run.name / "log.key").read_bytes())
    signer = Signer(origin, key)
    (run / "audit" / "log.vkey").write_text(signer.verifier.vkey + "\n")
    with sqlite3.connect(run / "store.db") as db:
        bodies = [bytes(b) for (b,) in db.execute("SELECT body FROM events WHERE leaf_index IS NOT NULL "
                                                  "ORDER BY leaf_index")]
    tree = MerkleTree()
    for body in bodies:
        tree.append(body)
    (run / "audit" / "leaves").write_bytes(b"".join(tree.leaf_hash(i) for i in range(tree.size)))
    for path in list_checkpoints(run / "audit"):
        size = read_checkpoint(path.read_text()).checkpoint.size
        path.write_text(sign_note(Checkpoint(origin, size, tree.root(size)).body, [signer]).render())


def _rewrite_the_objective(run: Path) -> None:
    """The goal's objective changed in its row and in its goal.created event alike: the store agrees with
    itself, so only the signatures over the events can tell."""
    with sqlite3.connect(run / "store.db") as db:
        (body,) = db.execute("SELECT body FROM events WHERE leaf_index = 0").fetchone()
        forged = bytes(body).replace(b"Should a small team", b"Must a large team!!")
        assert forged != bytes(body)
        db.execute("UPDATE events SET body = ? WHERE leaf_index = 0", (forged,))
        db.execute("UPDATE goals SET objective = replace(objective, 'Should a small team', 'Must a large team!!')")


def test_a_default_run_rewritten_and_re_signed_with_its_log_key_fails_verify_with_no_flags(home: Path) -> None:
    run = _run(home)
    assert sy(home, "audit", "verify", str(run)).returncode == 0
    if os.geteuid() == 0:  # the run's witness ran as its own user, whose key no other user may open
        witness = pwd.getpwnam("swarmyard-witness")
        private, key = home / "witness" / "private", home / "witness" / "private" / "witness.key"
        assert (private.stat().st_uid, stat.S_IMODE(private.stat().st_mode)) == (witness.pw_uid, 0o700)
        assert (key.stat().st_uid, stat.S_IMODE(key.stat().st_mode)) == (witness.pw_uid, 0o600)
    _rewrite_the_objective(run)
    _resign(home, run)
    alone = sy(home, "audit", "verify", str(run), "--no-witness",
               "--log-key", (run / "audit" / "log.vkey").read_text().strip())
    assert alone.returncode == 0, alone.stdout  # re-signed with the real key, the folder agrees with itself
    last = len(list_checkpoints(run / "audit"))
    _bad(sy(home, "audit", "verify", str(run)),
         f"witnessed {_size(run, last)}: the witness cosigned another root at this size (a fork)")

    # a fresh log key instead (the folder's log.vkey replaced): the witness still knows this run
    _resign(home, run, fresh_key=True)
    _bad(sy(home, "audit", "verify", str(run)), "witnessed 0: not a checkpoint signed by this log's key")
    # and under a new origin, which no witness knows: the folder's place names the log it must hold
    _resign(home, run, fresh_key=True, origin=f"swarmyard.local/{run.name}-rewritten")
    _bad(sy(home, "audit", "verify", str(run)), f"origin 0: the log is 'swarmyard.local/{run.name}-rewritten', "
                                                f"not 'swarmyard.local/{run.name}'")


def test_a_no_witness_run_verifies_and_says_what_it_cannot_detect(home: Path) -> None:
    """A log no witness cosigned proves only that its files agree with each other: verify fails it unless told the
    run had no witness, and then says so on its OK line."""
    run = _run(home, "--no-witness")
    assert not (run / "audit" / "witness.vkey").exists()
    _bad(sy(home, "audit", "verify", str(run)), f"witness 0: no witness home has cosigned swarmyard.local/{run.name}")
    done = sy(home, "audit", "verify", str(run), "--no-witness")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "log key from the folder; not witnessed; rollback not checked" in done.stdout
    assert (f"not witnessed: no witness cosigned swarmyard.local/{run.name}" in done.stderr
            and "re-signed with the run's log key, passes this check undetected" in done.stderr), done.stderr
    report = json.loads(sy(home, "audit", "verify", str(run), "--no-witness", "--json").stdout)
    assert (report["witness_home"], report["witnessed"], report["log_key_pinned"]) == (None, False, False)
    # the command the run's report gives passes as it is
    [check] = [line for line in (run / "report.md").read_text().splitlines() if line.startswith("- Check it: ")]
    command = shlex.split(check.removeprefix("- Check it: ").strip("`"))
    assert command[:3] == ["swarmyard", "audit", "verify"] and command[-1] == "--no-witness", command
    given = sy(home, *command[1:])
    assert given.returncode == 0 and "log key pinned; not witnessed" in given.stdout, given.stdout + given.stderr
    # and a contradiction is refused before anything starts
    both = sy(home, "run", str(home / "conf" / "swarm.toml"), "--no-witness", "--witness", str(home / "w.sock"))
    assert both.returncode == 1 and "give one or the other" in both.stderr, both.stderr


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_a_run_not_started_as_root_has_a_witness_of_its_users_and_verify_says_so(home: Path) -> None:
    """Run as uid 1000 of a user namespace (the host's files stay reachable), with the default witness home: it
    is made in the user's state folder, which stays 0700 for the run's secrets beside it."""
    swarm = _swarm(home)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8"}
    as_user = ["unshare", "--user", "--map-user=1000", "--map-group=1000"]
    done = subprocess.run([*as_user, str(SWARMYARD), "run", str(swarm), "--quiet", "--sandbox", "process"], cwd=home,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [run] = (home / "runs").iterdir()
    state = home / ".local" / "state" / "swarmyard"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert (state / "witness" / "public" / "checkpoints" / f"swarmyard.local%2F{run.name}.note").is_file()
    verified = subprocess.run([*as_user, str(SWARMYARD), "audit", "verify", str(run)], cwd=home, env=env,
                              capture_output=True, text=True, timeout=600)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "witness key pinned; not rolled back below" in verified.stdout
    assert "as the run does (the run was not started as root)" in verified.stderr


def test_a_run_folder_holding_another_runs_files_fails_verify(home: Path) -> None:
    """Two witnessed runs; run B's store and log copied into run A's folder are B's, not A's: the folder's name
    fixes the origin its log must have, and the witness home's record of exactly that origin is the one read."""
    first = _run(home)
    second = sy(home, "run", str(home / "conf" / "swarm.toml"), "--quiet")
    assert second.returncode == 0, second.stderr[-3000:]
    [other] = [p for p in (home / "runs").iterdir() if p != first]
    assert sy(home, "audit", "verify", str(other)).returncode == 0
    (first / "store.db").unlink()
    shutil.rmtree(first / "audit")
    shutil.copy(other / "store.db", first / "store.db")
    shutil.copytree(other / "audit", first / "audit")
    _bad(sy(home, "audit", "verify", str(first)),
         f"origin 0: the log is 'swarmyard.local/{other.name}', not 'swarmyard.local/{first.name}'")
    # the same files verify where they belong, and as what they claim when the caller names it
    assert sy(home, "audit", "verify", str(other)).returncode == 0
    named = sy(home, "audit", "verify", str(first), "--origin", f"swarmyard.local/{other.name}")
    assert named.returncode == 0 and named.stdout.startswith(f"OK swarmyard.local/{other.name} "), named.stdout


def test_a_run_folder_swapped_for_a_symlink_to_another_run_fails_verify_by_path_and_by_id(home: Path) -> None:
    """Run A's folder replaced by a symlink to run B's: the name the caller gave (the path as typed, or the run id)
    fixes the origin, so the link is refused, not checked as B; a run kept under its own name elsewhere and linked
    from its old place still verifies."""
    first = _run(home)
    second = sy(home, "run", str(home / "conf" / "swarm.toml"), "--quiet")
    assert second.returncode == 0, second.stderr[-3000:]
    [other] = [p for p in (home / "runs").iterdir() if p != first]
    shutil.rmtree(first)
    first.symlink_to(other.name)
    refused = (f"is a symlink to a folder named {other.name!r}, not {first.name!r}: the run folder's name fixes the "
               f"log it must hold (swarmyard.local/{first.name})")
    for given in (str(first), first.name, f"runs/{first.name}/"):
        done = sy(home, "audit", "verify", given)
        _bad(done, "origin 0: ")
        assert refused in done.stdout, done.stdout
    as_json = json.loads(sy(home, "audit", "verify", first.name, "--json").stdout)
    assert (as_json["ok"], as_json["what"]) == (False, "origin"), as_json
    # B verifies where it is, and as what it is when the caller names it
    assert sy(home, "audit", "verify", str(other)).returncode == 0
    named = sy(home, "audit", "verify", str(first), "--origin", f"swarmyard.local/{other.name}")
    assert named.returncode == 0 and named.stdout.startswith(f"OK swarmyard.local/{other.name} "), named.stdout
    # a run moved elsewhere under its own name, linked from where it was, is still itself
    archive = home / "archive"
    archive.mkdir()
    other.rename(archive / other.name)
    other.symlink_to(archive / other.name)
    for given in (str(other), other.name):
        kept = sy(home, "audit", "verify", given)
        assert kept.returncode == 0 and kept.stdout.startswith(f"OK swarmyard.local/{other.name} "), kept.stdout
