"""Signed scores: the evaluator's Ed25519 signature over the canonical JSON of every other field.

The signed message is ``canonical_json({"artifact_sha256", "goal", "issued_at", "score", "split"})``
(sorted keys, no spaces, UTF-8, see ``swarmyard.canonical``); ``issued_at`` is integer milliseconds since the
Unix epoch and ``signature`` is the base64 of the 64-byte Ed25519 signature. Anyone holding the evaluator's
public key can check a score with ``verify_score``, without talking to the evaluator.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import asdict, dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from swarmyard.canonical import canonical_json
from swarmyard.errors import InvalidInputError

_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class SignedScore:
    """An integer score for one artifact on one split of one goal, signed by the evaluator."""

    goal: str
    artifact_sha256: str
    split: str
    score: int
    issued_at: int
    signature: str

    def signed_fields(self) -> dict[str, Any]:
        """The fields the signature covers (every field but ``signature``)."""
        return {"goal": self.goal, "artifact_sha256": self.artifact_sha256, "split": self.split,
                "score": self.score, "issued_at": self.issued_at}

    def to_dict(self) -> dict[str, Any]:
        """The score as a JSON object."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> SignedScore:
        """Parse a JSON object; raise ``InvalidInputError`` naming the first missing or mistyped field."""
        if not isinstance(data, dict):
            raise InvalidInputError("a signed score must be a JSON object", field="score")
        types: dict[str, type] = {"goal": str, "artifact_sha256": str, "split": str, "score": int,
                                  "issued_at": int, "signature": str}
        for name, kind in types.items():
            value = data.get(name)
            # bool is an int subclass in Python but never a valid score or time
            if not isinstance(value, kind) or isinstance(value, bool):
                raise InvalidInputError(f"{name} must be a {kind.__name__}", field=name)
        extra = sorted(set(data) - set(types))
        if extra:
            raise InvalidInputError(f"unknown field {extra[0]!r}", field=extra[0])
        return cls(**{name: data[name] for name in types})


def signing_message(goal: str, artifact_sha256: str, split: str, score: int, issued_at: int) -> bytes:
    """The exact bytes the evaluator signs."""
    return canonical_json({"goal": goal, "artifact_sha256": artifact_sha256, "split": split, "score": score,
                           "issued_at": issued_at})


def sign_score(key: Ed25519PrivateKey, *, goal: str, artifact_sha256: str, split: str, score: int,
               issued_at: int) -> SignedScore:
    """Sign a score with the evaluator's key."""
    if not _SHA256_HEX.match(artifact_sha256):
        raise InvalidInputError("artifact_sha256 must be 64 lower-case hex digits", field="artifact_sha256")
    message = signing_message(goal, artifact_sha256, split, score, issued_at)
    signature = base64.b64encode(key.sign(message)).decode("ascii")
    return SignedScore(goal=goal, artifact_sha256=artifact_sha256, split=split, score=score,
                       issued_at=issued_at, signature=signature)


def verify_score(score: SignedScore, public_key: Ed25519PublicKey | bytes) -> bool:
    """True only if ``score`` carries a valid signature by ``public_key`` over exactly its fields."""
    try:
        key = public_key if isinstance(public_key, Ed25519PublicKey) else Ed25519PublicKey.from_public_bytes(
            public_key)
        signature = base64.b64decode(score.signature.encode("ascii"), validate=True)
    except (ValueError, binascii.Error, UnicodeEncodeError):
        return False
    # Only the canonical base64 text counts, so no two signature strings verify for one score.
    if base64.b64encode(signature).decode("ascii") != score.signature:
        return False
    if len(signature) != 64 or isinstance(score.score, bool) or isinstance(score.issued_at, bool):
        return False
    try:
        message = signing_message(score.goal, score.artifact_sha256, score.split, score.score,
                                  score.issued_at)
    except TypeError:
        return False
    try:
        key.verify(signature, message)
    except InvalidSignature:
        return False
    return True
