"""The AuditLog end to end: events become leaves, checkpoints are signed and cosigned, and ``audit verify``
names a tampered event, checkpoint or cosignature."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from swarmyard.audit.log import AuditLog, checkpoint_path
from swarmyard.audit.merkle import leaf_hash, root_of
from swarmyard.audit.note import COSIGNATURE_V1, Signer
from swarmyard.audit.verify import verify_run
from swarmyard.audit.witness import Witness, WitnessState
from swarmyard.canonical import canonical_json
from swarmyard.clock import FakeClock
from swarmyard.domain import Event, GoalSpec, PostKind, TaskSpec
from swarmyard.errors import LogMismatchError, UserError

ORIGIN = "swarmyard.test/run-1"


class ListSource:
    """An in-memory event source with the store's two audit methods."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def add(self, n: int) -> None:
        for _ in range(n):
            self.bodies.append(canonical_json({"kind": "test", "n": len(self.bodies)}))

    def sequence_events(self) -> int:
        return len(self.bodies)

    def read_events(self, start: int, end: int) -> list[Event]:
        return [Event(id=i + 1, leaf_index=i, kind="test", body=self.bodies[i], created_at=0.0)
                for i in range(start, min(end, len(self.bodies)))]


def _witness(tmp_path: Path, clock: FakeClock) -> Witness:
    return Witness(Signer("witness.test", Ed25519PrivateKey.generate(), COSIGNATURE_V1),
                   WitnessState(tmp_path / "witness.json"), clock=clock)


def _finished_run(tmp_path: Path, clock: FakeClock, events: int = 35) -> tuple[ListSource, Path, Witness]:
    source, audit = ListSource(), tmp_path / "audit"
    witness = _witness(tmp_path, clock)
    log = AuditLog(source, audit, ORIGIN, witness=witness, every_n=10)
    for _ in range(events):
        source.add(1)
        log.maybe_checkpoint()
        clock.advance(1)
    log.checkpoint()  # the end of the run
    log.close()
    return source, audit, witness


def _flip_char(line: str, at: int) -> str:
    chars = list(line)
    chars[at] = "A" if chars[at] != "A" else "B"
    return "".join(chars)


def _mismatch(source: ListSource, audit: Path) -> LogMismatchError:
    with pytest.raises(LogMismatchError) as caught:
        verify_run(source, audit)
    return caught.value


def test_a_finished_run_verifies(tmp_path: Path, clock: FakeClock) -> None:
    source, audit, witness = _finished_run(tmp_path, clock)
    report = verify_run(source, audit)
    assert report.size == 35
    assert report.root_hash == root_of([leaf_hash(b) for b in source.bodies])
    assert report.checkpoints == 4 and report.cosigned == 4  # sizes 10, 20, 30 and 35
    names = sorted(p.name for p in (audit / "checkpoints").iterdir())
    assert names == [f"00000{i}.note" for i in range(1, 5)]
    assert (audit / "log.key").stat().st_mode & 0o777 == 0o600
    state = witness.state.get(ORIGIN)
    assert state is not None and state.size == 35


def test_tampered_event_is_named(tmp_path: Path, clock: FakeClock) -> None:
    source, audit, _ = _finished_run(tmp_path, clock)
    source.bodies[17] = canonical_json({"kind": "test", "n": 1700})
    err = _mismatch(source, audit)
    assert (err.what, err.index) == ("event", 17)


def test_tampered_event_and_leaves_file_is_caught_by_the_checkpoint(tmp_path: Path, clock: FakeClock) -> None:
    source, audit, _ = _finished_run(tmp_path, clock)
    source.bodies[17] = canonical_json({"kind": "test", "n": 1700})
    leaves = bytearray((audit / "leaves").read_bytes())
    leaves[17 * 32:18 * 32] = leaf_hash(source.bodies[17])
    (audit / "leaves").write_bytes(bytes(leaves))
    err = _mismatch(source, audit)
    assert (err.what, err.index) == ("checkpoint", 2)  # the first checkpoint covering leaf 17 (size 20)
    assert "[10, 20)" in err.reason


def test_tampered_checkpoint_is_named(tmp_path: Path, clock: FakeClock) -> None:
    source, audit, _ = _finished_run(tmp_path, clock)
    path = checkpoint_path(audit, 3)
    text = path.read_text().replace(f"{ORIGIN}\n30\n", f"{ORIGIN}\n31\n", 1)
    path.write_text(text)
    err = _mismatch(source, audit)
    assert (err.what, err.index) == ("checkpoint", 3)


def test_tampered_cosignature_is_named(tmp_path: Path, clock: FakeClock) -> None:
    source, audit, _ = _finished_run(tmp_path, clock)
    path = checkpoint_path(audit, 2)
    lines = path.read_text().split("\n")
    last = lines[-2]  # the witness's line
    assert last.startswith("\u2014 witness.test ")
    lines[-2] = _flip_char(last, -20)  # inside the Ed25519 signature, not a base64 padding bit
    path.write_text("\n".join(lines))
    err = _mismatch(source, audit)
    assert (err.what, err.index) == ("cosignature", 2)


def test_missing_and_uncovered_events_are_named(tmp_path: Path, clock: FakeClock) -> None:
    source, audit, _ = _finished_run(tmp_path, clock)
    source.add(2)
    err = _mismatch(source, audit)
    assert (err.what, err.index) == ("event", 35)
    assert "not covered" in err.reason
    del source.bodies[30:]
    err = _mismatch(source, audit)
    assert (err.what, err.index) == ("event", 30)


def test_a_deleted_checkpoint_is_named(tmp_path: Path, clock: FakeClock) -> None:
    source, audit, _ = _finished_run(tmp_path, clock)
    checkpoint_path(audit, 2).unlink()
    err = _mismatch(source, audit)
    assert (err.what, err.index) == ("checkpoint", 2)


def test_restart_continues_and_recovers_a_lost_cosignature(tmp_path: Path, clock: FakeClock) -> None:
    source, audit = ListSource(), tmp_path / "audit"
    witness = _witness(tmp_path, clock)
    log = AuditLog(source, audit, ORIGIN, witness=witness, every_n=10)
    source.add(10)
    log.checkpoint()
    source.add(10)
    log.checkpoint()
    log.close()
    # A crash after the witness answered but before its line reached the file: drop the line.
    path = checkpoint_path(audit, 2)
    path.write_text("".join(line + "\n" for line in path.read_text().split("\n")[:-2]))

    log = AuditLog(source, audit, ORIGIN, witness=witness, every_n=10)
    assert log.tree.size == 20  # reloaded from the leaves file, not re-read
    source.add(5)
    signed = log.checkpoint()  # the witness says 20, the log thought 10: it retries from 20
    assert [s.name for s in signed.note.signatures] == [ORIGIN, "witness.test"]
    log.close()
    report = verify_run(source, audit)
    assert (report.size, report.checkpoints, report.cosigned) == (25, 3, 2)


def test_a_run_with_another_log_key_is_refused_by_the_witness(tmp_path: Path, clock: FakeClock) -> None:
    from swarmyard.errors import WitnessRefusedError

    source, audit, witness = _finished_run(tmp_path, clock, events=12)
    (audit / "log.key").unlink()
    (audit / "log.vkey").unlink()
    # the log itself refuses to go on from checkpoints its key did not sign
    with pytest.raises(LogMismatchError, match="checkpoint 2: does not verify with this log's key"):
        AuditLog(source, audit, ORIGIN, witness=witness)
    shutil.rmtree(audit)
    log = AuditLog(source, audit, ORIGIN, witness=witness)  # a fresh log and key under the same origin
    with pytest.raises(WitnessRefusedError):
        log.checkpoint()
    log.close()


def _populate(store_url: str, clock: FakeClock, blob_dir: Path) -> None:
    from swarmyard.store import open_store

    store = open_store(store_url, clock=clock, blob_dir=blob_dir)
    try:
        goal = store.create_goal(GoalSpec(objective="audit me", budget_micro_usd=1_000_000, call_cap=10))
        for i in range(3):
            store.create_task(goal.id, TaskSpec(title=f"t{i}", budget_micro_usd=1000, call_cap=2))
        claim = store.claim(goal.id, "w1", 30.0)
        assert claim is not None
        store.post(claim.task.id, claim.token, PostKind.PROGRESS, "hello", author="w1")
        store.record_event("machine.created", {"machine": "m1"})
        store.complete(claim.task.id, claim.token, "done")
    finally:
        store.close()


def test_a_real_store_run_verifies_on_each_engine(store_url: str, clock: FakeClock, tmp_path: Path) -> None:
    from swarmyard.store import open_store

    _populate(store_url, clock, tmp_path / "blobs")
    store = open_store(store_url, clock=clock, blob_dir=tmp_path / "blobs")
    try:
        log = AuditLog(store, tmp_path / "audit", ORIGIN, witness=_witness(tmp_path, clock), every_n=3)
        log.maybe_checkpoint()
        log.checkpoint()
        log.close()
        events = store.read_events(0, 1000)
        report = verify_run(store, tmp_path / "audit")
    finally:
        store.close()
    kinds = [e.kind for e in events]
    assert "machine.created" in kinds and len(kinds) >= 7
    assert report.size == len(events)
    assert report.root_hash == root_of([leaf_hash(e.body) for e in events])
    for event in events:
        assert canonical_json(json.loads(event.body)) == event.body  # the leaf encoding contract


def test_audit_verify_command_names_each_tampering(clock: FakeClock, tmp_path: Path) -> None:
    from swarmyard.cli.main import app
    from swarmyard.store import open_store

    run = tmp_path / "runs" / "run_1"
    run.mkdir(parents=True)
    url = f"sqlite:///{run / 'store.db'}"
    _populate(url, clock, run / "blobs")
    store = open_store(url, clock=clock, blob_dir=run / "blobs")
    log = AuditLog(store, run / "audit", ORIGIN, witness=_witness(tmp_path, clock), every_n=3)
    log.maybe_checkpoint()
    log.checkpoint()
    log.close()
    size = store.sequence_events()
    store.close()

    runner = CliRunner()
    # its witness is in this process, with no home: the folder's witness key checks the cosignatures
    alone = ["--origin", ORIGIN, "--no-witness"]
    ok = runner.invoke(app, ["audit", "verify", str(run), *alone, "--json"])
    assert ok.exit_code == 0, ok.output
    body = json.loads(ok.stdout)
    assert body["ok"] is True and body["size"] == size and body["checkpoints"] == 2

    def bad(*args: str) -> str:
        result = runner.invoke(app, ["audit", "verify", str(run), *alone, *args])
        assert result.exit_code == 1, result.output
        return str(result.stdout)

    with sqlite3.connect(run / "store.db") as db:
        (original,) = db.execute("SELECT body FROM events WHERE leaf_index = 4").fetchone()
        forged = bytes(original).replace(b"}", b',"x":1}')
        db.execute("UPDATE events SET body = ? WHERE leaf_index = 4", (forged,))
    assert bad().startswith("BAD event 4:")
    with sqlite3.connect(run / "store.db") as db:
        db.execute("UPDATE events SET body = ? WHERE leaf_index = 4", (original,))

    first = checkpoint_path(run / "audit", 1)
    saved = first.read_text()
    first.write_text(saved.replace(f"{ORIGIN}\n{size}\n", f"{ORIGIN}\n{size - 1}\n", 1))
    named = json.loads(bad("--json"))
    assert (named["ok"], named["what"], named["index"]) == (False, "checkpoint", 1)
    first.write_text(saved)

    last = checkpoint_path(run / "audit", 2)
    text = last.read_text()
    witness_line = text.rstrip("\n").split("\n")[-1]
    last.write_text(text.replace(witness_line, _flip_char(witness_line, -20)))
    assert bad().startswith("BAD cosignature 2:")
    last.write_text(text)
    assert runner.invoke(app, ["audit", "verify", str(run), *alone]).exit_code == 0


def test_a_log_re_signed_with_a_fresh_key_is_caught_only_by_a_pinned_key(tmp_path: Path, clock: FakeClock) -> None:
    from swarmyard.audit.log import LOG_VKEY
    from swarmyard.audit.note import Verifier
    from swarmyard.cli.main import app

    source, audit, witness = _finished_run(tmp_path, clock)
    honest_log = Verifier.parse((audit / LOG_VKEY).read_text())
    honest_witness = witness.verifier()
    # Whoever can rewrite the store can rewrite the folder: tamper an event, then re-sign everything with a
    # key of their own (and no witness, whose key they do not hold).
    source.bodies[3] = canonical_json({"kind": "test", "n": 3, "forged": True})
    forged = tmp_path / "forged"
    AuditLog(source, forged, ORIGIN, every_n=10).checkpoint()
    assert verify_run(source, forged).size == 35  # self-consistent: a folder alone cannot tell
    with pytest.raises(LogMismatchError) as caught:
        verify_run(source, forged, log_key=honest_log)
    assert (caught.value.what, caught.value.index) == ("key", 0)
    with pytest.raises(LogMismatchError) as caught:
        verify_run(source, forged, witness_key=honest_witness)
    # the forged folder has no witness key of its own: checked with the pinned one, nothing in it is cosigned
    assert (caught.value.what, caught.value.index) == ("cosignature", 1)

    source.bodies[3] = canonical_json({"kind": "test", "n": 3})
    assert verify_run(source, audit, log_key=honest_log, witness_key=honest_witness).cosigned == 4

    # the command checks pinned keys (inline or from a file) before anything else
    run = tmp_path / "run"
    run.mkdir()
    (run / "audit").symlink_to(forged)
    (tmp_path / "log.vkey").write_text(honest_log.vkey + "\n")
    runner = CliRunner()
    empty = ["--store", f"sqlite:///{tmp_path / 'empty.db'}", "--origin", ORIGIN, "--no-witness"]
    for pin in (honest_log.vkey, str(tmp_path / "log.vkey")):
        result = runner.invoke(app, ["audit", "verify", str(run), *empty, "--log-key", pin])
        assert result.exit_code == 1 and result.stdout.startswith("BAD key 0:"), result.output
    bad_key = runner.invoke(app, ["audit", "verify", str(run), *empty, "--log-key", "nope"])
    assert isinstance(bad_key.exception, UserError) and "neither a verifier key" in bad_key.exception.message


def test_a_reopened_log_refuses_events_it_cannot_account_for(clock: FakeClock, tmp_path: Path) -> None:
    """A crashed run (no ``run.closed``): events past its last checkpoint are signed on resume, unless dated
    well before the witness cosigned that checkpoint; a closed run signs none it did not write itself."""
    from swarmyard.audit.log import LATE_S, RUN_CLOSED
    from swarmyard.errors import AuditError
    from swarmyard.store import open_store

    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(url, clock=clock, blob_dir=tmp_path / "blobs")
    witness = _witness(tmp_path, clock)
    try:
        log = AuditLog(store, tmp_path / "audit", ORIGIN, witness=witness)
        store.create_goal(GoalSpec(objective="audit me", budget_micro_usd=1000, call_cap=1))
        log.checkpoint()  # then the run crashes: no run.closed, the log not closed
        log.close()
        with sqlite3.connect(tmp_path / "store.db") as db:
            db.execute("INSERT INTO events (kind, body, created_at) VALUES ('x', ?, ?)",
                       (b'{"kind":"x"}', clock.now() - LATE_S - 5))
        with pytest.raises(AuditError, match=r"refusing to sign event 1 \('x'\): it is dated 65 s before the witness"):
            AuditLog(store, tmp_path / "audit", ORIGIN, witness=witness)
        with sqlite3.connect(tmp_path / "store.db") as db:
            db.execute("UPDATE events SET created_at = ? WHERE kind = 'x'", (clock.now(),))
        log = AuditLog(store, tmp_path / "audit", ORIGIN, witness=witness)  # dated after: it may be the run's
        store.record_event(RUN_CLOSED, {"run": "run-1"})
        log.checkpoint()
        log.close()
        store.record_event("late", {})
        with pytest.raises(AuditError, match=r"refusing to sign event 3 \('late'\): it was written after the run "
                                             r"closed at checkpoint 2"):
            AuditLog(store, tmp_path / "audit", ORIGIN, witness=witness)
        # a leaves file that no longer has the checkpoint's root is named before anything is signed
        with sqlite3.connect(tmp_path / "store.db") as db:
            db.execute("DELETE FROM events WHERE kind = 'late'")
        leaves = tmp_path / "audit" / "leaves"
        leaves.write_bytes(bytes(32) + leaves.read_bytes()[32:])
        with pytest.raises(LogMismatchError, match="checkpoint 2: the leaves file does not have its root"):
            AuditLog(store, tmp_path / "audit", ORIGIN, witness=witness)
    finally:
        store.close()
