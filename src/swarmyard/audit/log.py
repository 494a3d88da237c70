"""The ``AuditLog``: turns the store's sequenced events into Merkle leaves and writes signed checkpoints.

A run's ``audit/`` folder holds::

    log.key             the log's Ed25519 seed (0600, created with O_EXCL), unless it is kept elsewhere (a run
                        keeps it in its private state folder, see ``swarmyard.swarm.run_secrets``)
    log.vkey            its verifier key (``ORIGIN+keyid+key``): what ``audit verify`` trusts
    witness.vkey        the witness's cosignature verifier key, pinned on first contact
    leaves              every leaf hash, 32 bytes each, in leaf order (lets ``audit verify`` name the exact
                        bad event; the checkpoints authenticate it)
    checkpoints/NNNNNN.note   one signed note per checkpoint, with the witness's cosignature line

Leaf ``i`` is the canonical JSON body of the event with leaf index ``i``, hashed as ``SHA-256(0x00 || body)``.

Reopening a log that has checkpoints (a resumed run) checks it before signing anything more: the last
checkpoint against this log's key and the leaves file, the source's events against the leaves, and then the
events no checkpoint covers yet. A run that ended records a ``run.closed`` event and checkpoints it, with
nothing running that could write: an event past that checkpoint was written by no run, and the log refuses to
sign it (an ``AuditError`` naming the event). A run that crashed has events past its last checkpoint that no one can
tell from forged ones by the store alone; the log refuses only those dated more than ``LATE_S`` before the
witness cosigned that checkpoint (the sync that made it had sequenced every event committed by then).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import BinaryIO, Protocol
from urllib.parse import quote

from swarmyard.audit.checkpoint import Checkpoint, SignedCheckpoint, open_checkpoint, read_checkpoint
from swarmyard.audit.merkle import HASH_SIZE, leaf_hash
from swarmyard.audit.note import NoteSignature, Signer, Verifier, sign_note
from swarmyard.audit.tree import MerkleTree
from swarmyard.audit.witness import WitnessClient
from swarmyard.domain import Event
from swarmyard.errors import AuditError, InvalidInputError, LogMismatchError, WitnessRefusedError
from swarmyard.secret_files import load_or_create_ed25519

log = logging.getLogger(__name__)

LOG_KEY = "log.key"
LOG_VKEY = "log.vkey"
WITNESS_VKEY = "witness.vkey"
LEAVES = "leaves"
CHECKPOINTS = "checkpoints"
READ_BATCH = 5000
#: The event a run records, and checkpoints, as it ends: nothing may follow it until the run is resumed.
RUN_CLOSED = "run.closed"
#: How long before the witness cosigned a run's last checkpoint an event past it may be dated (a write that
#: committed while the checkpoint was being made, clocks apart).
LATE_S = 60.0


def run_origin(run_id: str) -> str:
    """The origin of a run's log: fixed by the run's id (its folder's name), so ``audit verify`` knows which log
    a folder must hold without reading the folder's own word for it."""
    return f"swarmyard.local/{run_id}"


def serve_origin(audit_dir: Path) -> str:
    """The origin of the log ``swarmyard serve --audit-dir DIR`` keeps: fixed by where the folder is (its
    resolved path, %-quoted into a key name), for the same reason as ``run_origin``."""
    return "swarmyard.serve" + quote(str(audit_dir.resolve()), safe="/")


class EventSource(Protocol):
    """Where events come from: the store, or anything with the same two methods."""

    def sequence_events(self) -> int:
        """Give every committed, unsequenced event its leaf index; return the leaf count."""
        ...

    def read_events(self, start: int, end: int) -> list[Event]:
        """Sequenced events with ``start <= leaf_index < end``, in order."""
        ...


def checkpoint_path(audit_dir: Path, number: int) -> Path:
    """Where checkpoint ``number`` (counting from 1) lives."""
    return audit_dir / CHECKPOINTS / f"{number:06d}.note"


def list_checkpoints(audit_dir: Path) -> list[Path]:
    """Every checkpoint file, in order."""
    folder = audit_dir / CHECKPOINTS
    return sorted(folder.glob("*.note")) if folder.is_dir() else []


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _pin(path: Path, value: str, what: str) -> None:
    # A key written once is never silently replaced: a different one means a different log or witness.
    if path.exists():
        if path.read_text().strip() != value:
            raise AuditError(f"{what} in {path.name} differs from the one in use")
        return
    _write_atomic(path, value + "\n")


def _unaccounted(index: int, kind: str, why: str) -> AuditError:
    return AuditError(f"refusing to sign event {index} ({kind!r}): {why}; see `swarmyard audit verify`",
                      index=index, kind=kind)


class AuditLog:
    """Appends the source's events to the tree and writes checkpoints, cosigned by the witness if any."""

    def __init__(self, source: EventSource, audit_dir: Path, origin: str, *,
                 witness: WitnessClient | None = None, every_n: int = 1000, key_path: Path | None = None) -> None:
        """``key_path``: where the signing seed lives (a run keeps it outside the folder others read); by
        default ``log.key`` in ``audit_dir``."""
        if every_n < 1:
            raise InvalidInputError("every_n must be at least 1", field="every_n")
        self.source = source
        self.audit_dir = audit_dir
        self.origin = origin
        self.witness = witness
        self.every_n = every_n
        audit_dir.mkdir(parents=True, exist_ok=True)
        (audit_dir / CHECKPOINTS).mkdir(exist_ok=True)
        self.signer = Signer(origin, load_or_create_ed25519(key_path or audit_dir / LOG_KEY))
        _pin(audit_dir / LOG_VKEY, self.signer.verifier.vkey, "the log key")
        self.witness_verifier: Verifier | None = None
        if witness is not None:
            self.witness_verifier = witness.verifier()
            _pin(audit_dir / WITNESS_VKEY, self.witness_verifier.vkey, "the witness key")
        self.tree = MerkleTree()
        self._load_leaves()
        self._leaves: BinaryIO = open(audit_dir / LEAVES, "ab")  # noqa: SIM115 - held open for appends
        self._checkpoints = 0
        self._last_checkpoint_size = 0
        self._witnessed_size = 0
        self._load_checkpoints()
        self._check_reopened()

    @property
    def verifier(self) -> Verifier:
        """The log's verifier key."""
        return self.signer.verifier

    def _load_leaves(self) -> None:
        path = self.audit_dir / LEAVES
        data = path.read_bytes() if path.exists() else b""
        if len(data) % HASH_SIZE:
            raise AuditError(f"{LEAVES} is {len(data)} bytes, not a whole number of hashes")
        for offset in range(0, len(data), HASH_SIZE):
            self.tree.append_hash(data[offset:offset + HASH_SIZE])

    def _load_checkpoints(self) -> None:
        for path in list_checkpoints(self.audit_dir):
            signed = read_checkpoint(path.read_text())
            self._checkpoints += 1
            self._last_checkpoint_size = signed.checkpoint.size
            witness = self.witness_verifier
            if witness is not None and any(s.key_id == witness.key_id for s in signed.note.signatures):
                self._witnessed_size = signed.checkpoint.size

    def _check_reopened(self) -> None:
        """Check an existing log before it signs anything more (see the module docstring)."""
        paths = list_checkpoints(self.audit_dir)
        if not paths:
            return
        number = len(paths)
        try:
            signed, _ = open_checkpoint(paths[-1].read_text(), self.verifier, origin=self.origin)
        except AuditError as exc:
            raise LogMismatchError("checkpoint", number, f"does not verify with this log's key: {exc.message}") from exc
        cp = signed.checkpoint
        if self.tree.size < cp.size or self.tree.root(cp.size) != cp.root_hash:
            raise LogMismatchError("checkpoint", number, f"the {LEAVES} file does not have its root at size {cp.size}")
        count = self.source.sequence_events()
        if count < cp.size:
            raise LogMismatchError("event", count, f"missing: checkpoint {number} covers {cp.size} events")
        closed = False
        for start in range(0, count, READ_BATCH):
            events = self.source.read_events(start, min(start + READ_BATCH, count))
            for offset, event in enumerate(events):
                index = start + offset
                if index < self.tree.size and leaf_hash(event.body) != self.tree.leaf_hash(index):
                    raise LogMismatchError("event", index, "its leaf hash differs from the one the log recorded")
                if index == cp.size - 1:
                    closed = event.kind == RUN_CLOSED
                if index >= cp.size:
                    self._check_late(event, index, number, closed, signed)

    def _check_late(self, event: Event, index: int, number: int, closed: bool, signed: SignedCheckpoint) -> None:
        """Refuse an event past checkpoint ``number`` that the run cannot have written after it."""
        if closed:
            raise _unaccounted(index, event.kind, f"it was written after the run closed at checkpoint {number}, "
                                                  f"by no run")
        witness = self.witness_verifier
        times = [sig.timestamp for sig in signed.note.signatures
                 if witness is not None and sig.key_id == witness.key_id and sig.timestamp is not None
                 and witness.verify(signed.note.text, sig.signature)]
        if times and event.created_at < times[0] - LATE_S:
            raise _unaccounted(index, event.kind, f"it is dated {times[0] - event.created_at:.0f} s before the "
                                                  f"witness cosigned checkpoint {number}, which would have covered it")

    def sync(self) -> int:
        """Sequence the source's new events and append them as leaves; return the tree size."""
        count = self.source.sequence_events()
        if count < self.tree.size:
            raise LogMismatchError("event", count,
                                   f"the source has {count} events but the log has {self.tree.size}")
        start = self.tree.size
        while start < count:
            end = min(start + READ_BATCH, count)
            events = self.source.read_events(start, end)
            for offset, event in enumerate(events):
                if event.leaf_index != start + offset:
                    raise LogMismatchError("event", start + offset,
                                           f"the source returned leaf {event.leaf_index}")
                self.tree.append(event.body)
            if len(events) != end - start:
                raise LogMismatchError("event", start + len(events), "the source is missing sequenced events")
            self._leaves.write(b"".join(self.tree.leaf_hash(i) for i in range(start, end)))
            start = end
        self._leaves.flush()
        return self.tree.size

    def checkpoint(self) -> SignedCheckpoint:
        """Sync, sign a checkpoint of the whole tree, write it, and have the witness cosign it.

        The log-signed checkpoint is on disk before the witness is asked, so a witness that refuses (a typed
        error) or cannot be reached leaves the log's own commitment in place, just not cosigned.
        """
        size = self.sync()
        os.fsync(self._leaves.fileno())
        checkpoint = Checkpoint(self.origin, size, self.tree.root())
        note = sign_note(checkpoint.body, [self.signer])
        number = self._checkpoints + 1
        path = checkpoint_path(self.audit_dir, number)
        _write_atomic(path, note.render())
        self._checkpoints = number
        self._last_checkpoint_size = size
        if self.witness is not None:
            note = note.with_signature(self._cosign(note.render(), size))
            _write_atomic(path, note.render())
        log.debug("checkpoint %d at size %d", number, size)
        return SignedCheckpoint(checkpoint, note)

    def _cosign(self, note: str, size: int) -> NoteSignature:
        assert self.witness is not None
        old = self._witnessed_size
        for attempt in range(2):
            proof = self.tree.consistency_proof(old, size) if old > 0 else []
            try:
                cosignature = self.witness.add_checkpoint(old, proof, note, log_vkey=self.verifier.vkey)
            except WitnessRefusedError as exc:
                # The witness may have cosigned a later size than we remember (a crash after its answer):
                # retry once from the size it names, if that is within our tree.
                hint = exc.witness_size
                if attempt == 0 and hint is not None and hint != old and 0 <= hint <= size:
                    old = hint
                    continue
                raise
            self._witnessed_size = size
            return cosignature
        raise AssertionError("unreachable")  # pragma: no cover

    def maybe_checkpoint(self) -> SignedCheckpoint | None:
        """Sync, and write a checkpoint when ``every_n`` events arrived since the last one."""
        size = self.sync()
        if size - self._last_checkpoint_size >= self.every_n:
            return self.checkpoint()
        return None

    def close(self) -> None:
        """Flush and close the leaves file."""
        self._leaves.close()
