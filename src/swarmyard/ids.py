"""Identifiers: a short prefix naming the kind, then a time-ordered random part (sortable like a ULID)."""

from __future__ import annotations

import base64
import secrets
import threading
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case
# base64's base32 (RFC 4648 alphabet, in C) with its digits renamed: every store write makes an id or two,
# and a digit-by-digit loop in Python cost more than some of the SQL statements it accompanied
_TO_CROCKFORD = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", _ALPHABET.encode())


_last = 0
_lock = threading.Lock()


def new_id(prefix: str) -> str:
    """A new id such as ``task_01hx...``: 26 base32 digits, 50 bits of milliseconds then 80 random bits.

    Monotonic within a process (as ULIDs are): an id made in the same millisecond as the previous one is that
    one plus one, so ids made in one process sort in the order they were made.
    """
    global _last
    value = (time.time_ns() // 1_000_000) << 80 | secrets.randbits(80)  # 130 bits: 26 digits of 5 bits
    with _lock:
        if value >> 80 <= _last >> 80:
            value = _last + 1
        _last = value
    digits = base64.b32encode((value << 30).to_bytes(20, "big"))[:26]  # 160 bits = 32 digits; the first 26
    return f"{prefix}_{digits.translate(_TO_CROCKFORD).decode()}"
