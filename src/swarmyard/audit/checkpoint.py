"""C2SP tlog-checkpoint bodies and the signed checkpoints the audit log writes.

A checkpoint body is three lines: the log's origin, the tree size in decimal and the base64 root hash,
optionally followed by extension lines. The log signs it as a C2SP signed note (type 0x01, key name = origin);
a witness adds a C2SP tlog-cosignature/v1 line (type 0x04) to the same note.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass

from swarmyard.audit.merkle import HASH_SIZE
from swarmyard.audit.note import COSIGNATURE_V1, ED25519, Note, Verifier, open_note, parse_note
from swarmyard.errors import InvalidSignatureError


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A log's tree head: origin, size and root hash."""

    origin: str
    size: int
    root_hash: bytes
    extensions: tuple[str, ...] = ()

    @property
    def body(self) -> str:
        """The note text: origin, size and base64 root, one per line, then any extension lines."""
        lines = [self.origin, str(self.size), base64.b64encode(self.root_hash).decode(), *self.extensions]
        return "".join(line + "\n" for line in lines)

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        """Parse a checkpoint body, strictly (decimal size without leading zeros, a 32-byte root)."""
        if not text.endswith("\n"):
            raise InvalidSignatureError("a checkpoint body must end with a newline")
        lines = text[:-1].split("\n")
        if len(lines) < 3 or not lines[0] or any(not line for line in lines[3:]):
            raise InvalidSignatureError("a checkpoint needs origin, size and root lines")
        origin, size_text, root_text = lines[:3]
        # at most 20 digits (2**64 - 1): int() refuses more than 4300 with a ValueError, not a typed error
        if (not size_text.isdigit() or not size_text.isascii() or len(size_text) > 20
                or (size_text != "0" and size_text[0] == "0")):
            raise InvalidSignatureError(f"checkpoint size {size_text[:40]!r} is not a decimal number")
        try:
            root = base64.b64decode(root_text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidSignatureError("checkpoint root is not valid base64") from exc
        if len(root) != HASH_SIZE:
            raise InvalidSignatureError(f"checkpoint root is {len(root)} bytes, not {HASH_SIZE}")
        return cls(origin, int(size_text), root, tuple(lines[3:]))


@dataclass(frozen=True, slots=True)
class SignedCheckpoint:
    """A checkpoint and its signed note (the log's signature and any cosignatures)."""

    checkpoint: Checkpoint
    note: Note

    @property
    def text(self) -> str:
        """The whole signed note."""
        return self.note.render()

    @property
    def cosigned_at(self) -> dict[str, int]:
        """Cosigner name -> cosignature time, for every line carrying a timestamp (not yet verified)."""
        out: dict[str, int] = {}
        for sig in self.note.signatures[1:]:
            if sig.timestamp is not None:
                out[sig.name] = sig.timestamp
        return out


def open_checkpoint(message: str, log: Verifier, cosigners: Sequence[Verifier] = (), *,
                    origin: str | None = None) -> tuple[SignedCheckpoint, list[Verifier]]:
    """Check a signed checkpoint and return it with the known cosigners whose cosignatures hold.

    The log's signature must hold, every line from a known cosigner must verify and, when ``origin`` is
    given, the checkpoint must name it (C2SP only recommends that the origin equal the key name, so a
    caller that knows the log's origin says so).
    """
    if log.alg != ED25519:
        raise InvalidSignatureError("a log key must be an Ed25519 (type 0x01) key", key_name=log.name)
    note, verified = open_note(message, [log, *cosigners])
    if log not in verified:
        raise InvalidSignatureError(f"checkpoint is not signed by the log key {log.name}", key_name=log.name)
    checkpoint = Checkpoint.parse(note.text)
    if origin is not None and checkpoint.origin != origin:
        raise InvalidSignatureError(f"checkpoint origin {checkpoint.origin!r} is not {origin!r}",
                                    key_name=log.name)
    return SignedCheckpoint(checkpoint, note), [v for v in verified if v.alg == COSIGNATURE_V1]


def read_checkpoint(message: str) -> SignedCheckpoint:
    """Parse a signed checkpoint without checking any signature (to read what it claims)."""
    note = parse_note(message)
    return SignedCheckpoint(Checkpoint.parse(note.text), note)
