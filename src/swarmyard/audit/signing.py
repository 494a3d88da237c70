"""Ed25519 signing and strict verification, shared by the audit log and the evaluator's signed scores.

Verification accepts only a 32-byte public key and a 64-byte signature and answers a plain ``bool``; the
``cryptography`` backend rejects a non-canonical ``S`` and other malleable encodings (the Wycheproof vectors
check it).
"""

from __future__ import annotations

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PUBLIC_KEY_SIZE = 32
SIGNATURE_SIZE = 64


def sign_ed25519(key: Ed25519PrivateKey, message: bytes) -> bytes:
    """The 64-byte Ed25519 signature of ``message``."""
    return key.sign(message)


def verify_ed25519(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """Whether ``signature`` is a valid Ed25519 signature of ``message`` under the raw ``public_key``."""
    if len(public_key) != PUBLIC_KEY_SIZE or len(signature) != SIGNATURE_SIZE:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True
