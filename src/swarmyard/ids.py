"""Identifiers: a short prefix naming the kind, then a time-ordered random part (sortable like a ULID)."""

from __future__ import annotations

import secrets
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case


def _b32(value: int, width: int) -> str:
    out = []
    for _ in range(width):
        value, digit = divmod(value, 32)
        out.append(_ALPHABET[digit])
    return "".join(reversed(out))


def new_id(prefix: str) -> str:
    """A new id such as ``task_01hx...``: 48 bits of milliseconds, then 80 random bits."""
    millis = time.time_ns() // 1_000_000
    return f"{prefix}_{_b32(millis, 10)}{_b32(secrets.randbits(80), 16)}"
