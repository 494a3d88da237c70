"""Canonical JSON: the byte encoding of every audit leaf, a documented contract.

``canonical_json(obj)`` is ``json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``
encoded as UTF-8. Floats are not allowed in canonical documents (their text is not stable across
languages); times are integers of milliseconds and money is integer micro-USD.
"""

from __future__ import annotations

import json
from typing import Any

# Values that need no look inside: checked by exact type first, since every audit event passes here.
_PLAIN = frozenset({str, int, bool, type(None)})


def _reject_floats(value: Any) -> None:
    if type(value) in _PLAIN:
        return
    if isinstance(value, float):
        raise TypeError("canonical JSON carries no floats; use integers (milliseconds, micro-USD)")
    if isinstance(value, dict):
        for key, item in value.items():
            if type(key) is not str and not isinstance(key, str):
                raise TypeError("canonical JSON object keys must be strings")
            if type(item) not in _PLAIN:
                _reject_floats(item)
    elif isinstance(value, list | tuple):
        for item in value:
            if type(item) not in _PLAIN:
                _reject_floats(item)


def canonical_json(obj: Any) -> bytes:
    """Encode ``obj`` as canonical JSON bytes (sorted keys, no spaces, UTF-8, no floats)."""
    _reject_floats(obj)
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
