"""C2SP signed notes: a UTF-8 text, a blank line, then one ``— NAME base64(keyid || sig)`` line per signer.

Keys are strings: a verifier key is ``NAME+hex(keyid)+base64(type || public key)`` and a signer key is
``PRIVATE+KEY+NAME+hex(keyid)+base64(type || seed)``, with
``keyid = SHA-256(NAME || "\\n" || type || key)[:4]``. Two types are supported: ``0x01`` (Ed25519 over the
text) and ``0x04`` (C2SP tlog-cosignature/v1: Ed25519 over ``"cosignature/v1\\ntime <t>\\n"`` plus the text,
the signature bytes being an 8-byte big-endian ``t`` then the 64-byte signature).
Signatures from keys the reader does not know are kept but not trusted.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from swarmyard.audit.signing import sign_ed25519, verify_ed25519
from swarmyard.errors import InvalidSignatureError

ED25519 = 0x01
COSIGNATURE_V1 = 0x04
_SIG_PREFIX = "\u2014 "  # an em dash and a space start every signature line
_TIMESTAMP = struct.Struct(">Q")


def _check_name(name: str) -> None:
    if not name or "+" in name or any(ch.isspace() for ch in name):
        raise InvalidSignatureError(f"key name {name!r} is empty or holds a space or '+'",
                                    key_name=name or None)


def key_id(name: str, alg: int, public_key: bytes) -> bytes:
    """The 4-byte key id: ``SHA-256(name || "\\n" || alg || public key)[:4]``."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([alg]) + public_key).digest()[:4]


def cosignature_message(text: str, timestamp: int) -> bytes:
    """What a tlog-cosignature/v1 signs for a checkpoint ``text`` at ``timestamp`` (Unix seconds)."""
    return f"cosignature/v1\ntime {timestamp}\n".encode() + text.encode()


def _b64decode(value: str, what: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidSignatureError(f"{what} is not valid base64") from exc


@dataclass(frozen=True, slots=True)
class Verifier:
    """A public key that checks one signer's lines in a note."""

    name: str
    alg: int
    public_key: bytes

    @property
    def key_id(self) -> bytes:
        """The 4-byte key id."""
        return key_id(self.name, self.alg, self.public_key)

    @property
    def vkey(self) -> str:
        """The verifier key string ``NAME+hex(keyid)+base64(alg || key)``."""
        encoded = base64.b64encode(bytes([self.alg]) + self.public_key).decode()
        return f"{self.name}+{self.key_id.hex()}+{encoded}"

    @classmethod
    def parse(cls, vkey: str) -> Verifier:
        """Parse a verifier key string, checking its key id."""
        parts = vkey.strip().split("+", 2)  # base64 may itself hold '+'
        if len(parts) != 3 or len(parts[1]) != 8:
            raise InvalidSignatureError(f"malformed verifier key {vkey!r}")
        name, hex_id, encoded = parts
        _check_name(name)
        raw = _b64decode(encoded, "verifier key")
        if len(raw) != 33 or raw[0] not in (ED25519, COSIGNATURE_V1):
            raise InvalidSignatureError(f"verifier key {name}: unsupported type or length", key_name=name)
        verifier = cls(name, raw[0], raw[1:])
        if verifier.key_id.hex() != hex_id.lower():
            raise InvalidSignatureError(f"verifier key {name}: key id does not match the key", key_name=name)
        return verifier

    def verify(self, text: str, signature: bytes) -> bool:
        """Whether ``signature`` (the bytes after the key id) signs ``text`` under this key."""
        if self.alg == COSIGNATURE_V1:
            if len(signature) != _TIMESTAMP.size + 64:
                return False
            (timestamp,) = _TIMESTAMP.unpack(signature[:_TIMESTAMP.size])
            return verify_ed25519(self.public_key, cosignature_message(text, timestamp),
                                  signature[_TIMESTAMP.size:])
        return verify_ed25519(self.public_key, text.encode(), signature)


@dataclass(frozen=True, slots=True)
class Signer:
    """A private key that adds its line to a note: type 0x01 signs the text, 0x04 cosigns a checkpoint."""

    name: str
    key: Ed25519PrivateKey
    alg: int = ED25519

    def __post_init__(self) -> None:
        _check_name(self.name)
        if self.alg not in (ED25519, COSIGNATURE_V1):
            raise InvalidSignatureError(f"unsupported signature type {self.alg}", key_name=self.name)

    @property
    def verifier(self) -> Verifier:
        """The matching verifier."""
        raw = self.key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return Verifier(self.name, self.alg, raw)

    @property
    def skey(self) -> str:
        """The signer key string ``PRIVATE+KEY+NAME+hex(keyid)+base64(alg || seed)`` (a secret)."""
        seed = self.key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                      serialization.NoEncryption())
        encoded = base64.b64encode(bytes([self.alg]) + seed).decode()
        return f"PRIVATE+KEY+{self.name}+{self.verifier.key_id.hex()}+{encoded}"

    @classmethod
    def parse(cls, skey: str) -> Signer:
        """Parse a signer key string, checking its key id."""
        parts = skey.strip().split("+", 4)
        if len(parts) != 5 or parts[:2] != ["PRIVATE", "KEY"]:
            raise InvalidSignatureError("malformed signer key")
        _, _, name, hex_id, encoded = parts
        raw = _b64decode(encoded, "signer key")
        if len(raw) != 33:
            raise InvalidSignatureError(f"signer key {name}: wrong length", key_name=name)
        signer = cls(name, Ed25519PrivateKey.from_private_bytes(raw[1:]), raw[0])
        if signer.verifier.key_id.hex() != hex_id.lower():
            raise InvalidSignatureError(f"signer key {name}: key id does not match the key", key_name=name)
        return signer

    def signature(self, text: str, *, timestamp: int | None = None) -> NoteSignature:
        """This signer's line for ``text``; a cosigner needs ``timestamp`` (Unix seconds)."""
        if self.alg == COSIGNATURE_V1:
            if timestamp is None or timestamp < 0:
                raise InvalidSignatureError("a cosignature needs a timestamp", key_name=self.name)
            raw = _TIMESTAMP.pack(timestamp) + sign_ed25519(self.key, cosignature_message(text, timestamp))
        else:
            raw = sign_ed25519(self.key, text.encode())
        return NoteSignature(self.name, self.verifier.key_id, raw)


@dataclass(frozen=True, slots=True)
class NoteSignature:
    """One signature line: the signer's name, its key id and the signature bytes that follow the id."""

    name: str
    key_id: bytes
    signature: bytes

    @property
    def line(self) -> str:
        """The line as it appears in a note, with its newline."""
        return f"{_SIG_PREFIX}{self.name} {base64.b64encode(self.key_id + self.signature).decode()}\n"

    @property
    def timestamp(self) -> int | None:
        """For a cosignature, the time it was made (the first 8 signature bytes); ``None`` if too short."""
        if len(self.signature) < _TIMESTAMP.size:
            return None
        return int(_TIMESTAMP.unpack(self.signature[:_TIMESTAMP.size])[0])


@dataclass(frozen=True, slots=True)
class Note:
    """A note's text (ending in a newline) and its signature lines, in order."""

    text: str
    signatures: tuple[NoteSignature, ...]

    def render(self) -> str:
        """The note as bytes-on-the-wire text: text, blank line, signature lines."""
        return self.text + "\n" + "".join(sig.line for sig in self.signatures)

    def with_signature(self, signature: NoteSignature) -> Note:
        """A copy with one more signature line."""
        return Note(self.text, (*self.signatures, signature))


def _check_text(text: str) -> None:
    if not text.endswith("\n"):
        raise InvalidSignatureError("a note's text must end with a newline")
    if any(ord(ch) < 0x20 and ch != "\n" for ch in text):
        raise InvalidSignatureError("a note's text holds a control character")


def parse_note(message: str) -> Note:
    """Split a signed note into its text and signature lines, checking only their shape."""
    split = message.rfind("\n\n")
    if split < 0 or not message.endswith("\n"):
        raise InvalidSignatureError("malformed note: no blank line before the signatures")
    text, lines = message[:split + 1], message[split + 2:]
    _check_text(text)
    signatures = []
    for line in lines.split("\n")[:-1]:
        if not line.startswith(_SIG_PREFIX):
            raise InvalidSignatureError(f"malformed signature line {line!r}")
        name, _, encoded = line[len(_SIG_PREFIX):].partition(" ")
        _check_name(name)
        raw = _b64decode(encoded, f"signature of {name}")
        if len(raw) < 5:
            raise InvalidSignatureError(f"signature of {name} is too short", key_name=name)
        signatures.append(NoteSignature(name, raw[:4], raw[4:]))
    if not signatures:
        raise InvalidSignatureError("a note without signatures")
    return Note(text, tuple(signatures))


def sign_note(text: str, signers: Sequence[Signer], *, timestamp: int | None = None) -> Note:
    """A note of ``text`` signed by every signer in order."""
    _check_text(text)
    return Note(text, tuple(signer.signature(text, timestamp=timestamp) for signer in signers))


def open_note(message: str, verifiers: Iterable[Verifier]) -> tuple[Note, list[Verifier]]:
    """Parse ``message`` and check it: return the note and the known verifiers whose signatures hold.

    A signature from a known key (name and key id) that does not verify is a forgery and raises; a note with
    no valid signature from any known key raises too.
    """
    note = parse_note(message)
    known = {(v.name, v.key_id): v for v in verifiers}
    verified: list[Verifier] = []
    for sig in note.signatures:
        verifier = known.get((sig.name, sig.key_id))
        if verifier is None:
            continue
        if not verifier.verify(note.text, sig.signature):
            raise InvalidSignatureError(f"signature of {sig.name} does not verify", key_name=sig.name)
        if verifier not in verified:
            verified.append(verifier)
    if not verified:
        raise InvalidSignatureError("no signature from a known key")
    return note, verified
