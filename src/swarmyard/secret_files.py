"""Secret files, created once with mode 0600 (``O_EXCL``, never chmod-ed afterwards), and the Ed25519 signing keys
kept in them (the audit log's, the witness's, the evaluator's), loaded by path."""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey


def write_secret_file(path: Path, data: bytes) -> None:
    """Create ``path`` with mode 0600 and write ``data``; refuse to overwrite an existing file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def load_or_create_ed25519(path: Path) -> Ed25519PrivateKey:
    """Load the Ed25519 private key at ``path`` (raw 32-byte seed), creating it first if absent."""
    if not path.exists():
        key = Ed25519PrivateKey.generate()
        seed = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                 serialization.NoEncryption())
        try:
            write_secret_file(path, seed)
        except FileExistsError:
            pass  # another process won the race; load theirs
        else:
            return key
    return Ed25519PrivateKey.from_private_bytes(path.read_bytes())


def public_bytes(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    """The raw 32-byte public key."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
