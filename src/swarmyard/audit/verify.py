"""``audit verify``: recompute a run's tree from its events and check every checkpoint against it.

Checked in order, stopping at the first failure (``LogMismatchError`` naming the event, checkpoint or
cosignature and its index):

1. every checkpoint note: the log's signature, its origin, the witness's cosignature where one is pinned, and
   checkpoint numbering without gaps;
2. every event: leaf indexes contiguous from 0, its leaf hash equal to the one the log recorded, and the
   columns outside the hash held to its body (``kind``, and ``created_at`` against ``at_ms``);
3. every checkpoint's root equal to the root recomputed from the events at its size, and a consistency proof
   from the previous checkpoint that verifies;
4. no event past the last checkpoint, sequenced or not (given the store as ``tables``), and (with a witness)
   the last checkpoint cosigned. A run still in progress (``in_progress``) may have events its last checkpoint
   does not cover yet: they are counted, not checked, unless the log says the run closed (its last checkpoint
   ends with a ``run.closed`` event), when any such event is one no run wrote;
5. no rollback: the log holds at least as many events as the witness last cosigned (its checkpoint, given as
   ``witnessed``, must carry the log's signature and the witness's cosignature, and its root must be the log's
   root at that size) and at least ``min_size``;
6. given the store as ``tables``, every goal, task, finding, artifact and score row against what the events say
   of it, and every row they describe present (``swarmyard.audit.tables``); skipped for a run in progress,
   whose rows move ahead of its log.

The keys come from the run folder unless the caller pins them. A folder alone proves only that it is
self-consistent: whoever can rewrite the store can also write a fresh log key and re-sign every checkpoint.
Pinning the log's key (printed in the run's report) or the witness's key (held by the witness, not the run)
turns that into a detected forgery: a folder whose key differs from the pinned one fails as ``key``.
Pinned keys still pass a log cut back to one of its own earlier checkpoints (delete the later events and
checkpoint files), or rewritten and re-signed with the log's own key: only what the witness remembers (its
latest cosigned checkpoint, ``witnessed``), or a size the caller knows, catches that. ``swarmyard audit verify``
reads both from the host's witness home (``swarmyard.audit.witness_home``) with no flag.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from swarmyard.audit.checkpoint import SignedCheckpoint, open_checkpoint
from swarmyard.audit.log import (
    LEAVES,
    LOG_VKEY,
    READ_BATCH,
    RUN_CLOSED,
    WITNESS_VKEY,
    EventSource,
    list_checkpoints,
)
from swarmyard.audit.merkle import HASH_SIZE, leaf_hash, verify_consistency
from swarmyard.audit.note import Verifier
from swarmyard.audit.tables import Ledger, Tables, check_tables, parse_body
from swarmyard.audit.tree import MerkleTree
from swarmyard.domain import Event
from swarmyard.errors import AuditError, InvalidProofError, InvalidSignatureError, LogMismatchError


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """A log that verified: its size and root, and how many checkpoints and cosignatures were checked."""

    size: int
    root_hash: bytes
    origin: str
    checkpoints: int
    cosigned: int
    #: a key was pinned by the caller: without one the folder was only checked against itself
    pinned: bool = False
    #: the largest size the log was checked not to have been rolled back below (None: not checked)
    fresh_size: int | None = None
    #: events no checkpoint covers yet (only a run in progress may have any): not checked
    uncovered: int = 0
    #: the log says the run closed at its last checkpoint
    closed: bool = False
    #: the store's rows were checked against the events
    tables_checked: bool = False


def _open_checkpoints(audit_dir: Path, log: Verifier,
                      witness: Verifier | None) -> list[tuple[SignedCheckpoint, bool]]:
    out: list[tuple[SignedCheckpoint, bool]] = []
    for number, path in enumerate(list_checkpoints(audit_dir), start=1):
        if path.name != f"{number:06d}.note":
            raise LogMismatchError("checkpoint", number, f"missing (found {path.name} in its place)")
        message = path.read_text()
        # The log's own signature first (other lines are ignored here), so a rewritten body is named as the
        # checkpoint; then the witness's lines, so a forged cosignature is named as such.
        try:
            signed, _ = open_checkpoint(message, log, origin=log.name)
        except InvalidSignatureError as exc:
            raise LogMismatchError("checkpoint", number, exc.reason) from exc
        has_cosig = False
        if witness is not None:
            for sig in signed.note.signatures:
                if sig.name != witness.name:
                    continue
                if sig.key_id != witness.key_id or not witness.verify(signed.note.text, sig.signature):
                    raise LogMismatchError("cosignature", number, "the witness's cosignature does not verify")
                has_cosig = True
        if out and signed.checkpoint.size < out[-1][0].checkpoint.size:
            raise LogMismatchError("checkpoint", number, "its size is smaller than the previous checkpoint's")
        out.append((signed, has_cosig))
    return out


def _pinned(found: Verifier | None, pinned: Verifier | None, index: int, what: str) -> Verifier | None:
    if pinned is None:
        return found
    if found is None or found.vkey != pinned.vkey:
        raise LogMismatchError("key", index, f"the run folder's {what} key is not the pinned one")
    return pinned


def _read_batch(source: EventSource, start: int, end: int) -> tuple[list[Event], LogMismatchError | None]:
    """Events ``[start, end)``; an unreadable one (``rows.event``) ends the batch and is returned to raise once
    the events before it are checked, so that the first bad event is the one named."""
    try:
        return source.read_events(start, end), None
    except LogMismatchError as exc:
        if exc.what != "event" or not start <= exc.index < end:
            raise
        return source.read_events(start, exc.index), exc


def _check_witnessed(note: str, log: Verifier, witness: Verifier | None, tree: MerkleTree) -> int:
    """Check the witness's last cosigned checkpoint against the tree; return its size."""
    try:
        signed, _ = open_checkpoint(note, log, origin=log.name)
    except AuditError as exc:
        raise LogMismatchError("witnessed", 0, f"not a checkpoint signed by this log's key: {exc.message}") from exc
    cp = signed.checkpoint
    if witness is not None and not any(
            sig.name == witness.name and sig.key_id == witness.key_id and witness.verify(signed.note.text, sig.signature)
            for sig in signed.note.signatures):
        raise LogMismatchError("witnessed", cp.size, "not cosigned by the witness's key")
    if cp.size > tree.size:
        raise LogMismatchError("event", tree.size, f"missing: the witness cosigned {cp.size} events and the log "
                                                   f"holds {tree.size} (rolled back)")
    if tree.root(cp.size) != cp.root_hash:
        raise LogMismatchError("witnessed", cp.size, "the witness cosigned another root at this size (a fork)")
    return cp.size


def verify_run(source: EventSource, audit_dir: Path, *, log_key: Verifier | None = None,
               witness_key: Verifier | None = None, witnessed: Sequence[str] = (),
               min_size: int = 0, tables: Tables | None = None, in_progress: bool = False) -> VerifyReport:
    """Verify a run's audit log against its events; raise ``LogMismatchError`` at the first bad thing.

    ``log_key`` and ``witness_key`` pin the keys instead of trusting the folder's (key 0 is the log's,
    key 1 the witness's in the error). ``witnessed`` are checkpoints the witness cosigned (its latest, as
    ``GET /checkpoint`` answers it) and ``min_size`` a size the caller knows the log reached: a log with fewer
    events fails as rolled back. ``tables`` (the store) adds the unsequenced events and the rows to the check;
    ``in_progress`` lets events past the last checkpoint of a run that has not closed through: counted,
    not checked.
    """
    vkey_path = audit_dir / LOG_VKEY
    if not vkey_path.exists():
        raise AuditError(f"no audit log in {audit_dir} ({LOG_VKEY} is missing)")
    log = _pinned(Verifier.parse(vkey_path.read_text()), log_key, 0, "log")
    assert log is not None
    witness_path = audit_dir / WITNESS_VKEY
    # a folder without the witness's key (a --no-witness run's, or one whose copy was removed) is checked with the
    # pinned key all the same: what that witness cosigned, or the lack of it, is then named
    witness = (witness_key if witness_key is not None and not witness_path.exists() else
               _pinned(Verifier.parse(witness_path.read_text()) if witness_path.exists() else None,
                       witness_key, 1, "witness"))
    checkpoints = _open_checkpoints(audit_dir, log, witness)

    leaves_path = audit_dir / LEAVES
    recorded = leaves_path.read_bytes() if leaves_path.exists() else b""
    # Only what is already sequenced, read batch by batch: verifying never writes to the store it checks
    # (sequence_events would give leaf indexes to rows someone added without one).
    tree = MerkleTree()
    ledger = Ledger()
    closes: set[int] = set()
    start = 0
    while True:
        end = start + READ_BATCH
        events, unreadable = _read_batch(source, start, end)
        for offset, event in enumerate(events):
            index = start + offset
            if event.leaf_index != index:
                raise LogMismatchError("event", index, "missing or out of order")
            digest = leaf_hash(event.body)
            if recorded[index * HASH_SIZE:(index + 1) * HASH_SIZE] not in (b"", digest):
                raise LogMismatchError("event", index, "its leaf hash differs from the one the log recorded")
            tree.append_hash(digest)
            body = parse_body(event, index)
            ledger.add(index, event.kind, body)
            if event.kind == RUN_CLOSED:
                closes.add(index)
        if unreadable is not None:
            if unreadable.index != start + len(events):
                raise LogMismatchError("event", start + len(events), "missing or out of order")
            raise unreadable
        if len(events) < end - start:
            break
        start = end

    previous: SignedCheckpoint | None = None
    for number, (signed, _) in enumerate(checkpoints, start=1):
        cp = signed.checkpoint
        if cp.size > tree.size:
            raise LogMismatchError("event", tree.size,
                                   f"missing: checkpoint {number} covers {cp.size} events")
        if tree.root(cp.size) != cp.root_hash:
            low = previous.checkpoint.size if previous else 0
            raise LogMismatchError("checkpoint", number,
                                   f"root does not match the events; a bad event lies in [{low}, {cp.size})")
        if previous is not None and previous.checkpoint.size > 0:
            old = previous.checkpoint
            try:
                proof = tree.consistency_proof(old.size, cp.size)
                verify_consistency(old.size, cp.size, proof, old.root_hash, cp.root_hash)
            except InvalidProofError as exc:
                raise LogMismatchError("checkpoint", number,
                                       f"not consistent with the previous: {exc.reason}") from exc
        previous = signed
    if previous is None:
        raise LogMismatchError("checkpoint", 1, "the run has no checkpoint")
    covered = previous.checkpoint.size
    closed = covered - 1 in closes
    lenient = in_progress and not closed
    why = "the run closed at the last checkpoint" if closed else "no checkpoint covers it"
    if covered != tree.size and not lenient:
        raise LogMismatchError("event", covered, f"not covered by any checkpoint ({why})")
    unsequenced = tables.unsequenced_events(10_000) if tables is not None else []
    if unsequenced and not lenient:
        first = unsequenced[0]
        raise LogMismatchError("unsequenced", first.id, f"event row {first.id} ({first.kind!r}) has no leaf index: "
                                                        f"not covered by any checkpoint ({why})")
    # what the witness cosigned first: a log re-signed with its own key after a rewrite is then named as the fork
    # it is, rather than as a checkpoint that merely lacks a cosignature
    fresh = [_check_witnessed(note, log, witness, tree) for note in witnessed]
    if witness is not None and not checkpoints[-1][1]:
        raise LogMismatchError("cosignature", len(checkpoints), "the last checkpoint is not cosigned")
    if tree.size < min_size:
        raise LogMismatchError("event", tree.size, f"missing: the log should hold at least {min_size} events and "
                                                   f"holds {tree.size} (rolled back)")
    fresh_size = max([*fresh, min_size]) if fresh or min_size else None
    if tables is not None and not in_progress:
        check_tables(tables, ledger)
    return VerifyReport(covered, tree.root(covered), log.name, len(checkpoints), sum(c for _, c in checkpoints),
                        pinned=log_key is not None or witness_key is not None, fresh_size=fresh_size,
                        uncovered=tree.size - covered + len(unsequenced), closed=closed,
                        tables_checked=tables is not None and not in_progress)
