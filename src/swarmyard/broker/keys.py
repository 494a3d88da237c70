"""Provider keys: read from the broker's environment or from a key file created 0600 with ``O_EXCL``.

Keys never come from a worker. A ``Secret`` never shows its value in ``repr`` or ``str``, so a key cannot slip
into a log line or an error message by formatting; ``scrub`` takes every key this process holds out of text
that came from elsewhere (an upstream's error body), in whichever encoding the upstream echoed it.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import stat
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from swarmyard.errors import ConfigError
from swarmyard.keys import write_secret_file

#: provider name -> environment variable holding its key.
ENV_NAMES: dict[str, str] = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "deepseek": "DEEPSEEK_API_KEY",
}


#: What a key is replaced with in scrubbed text.
REDACTED = "***"
#: Encoded forms shorter than this are not searched for (a key that short would match ordinary text).
_MIN_FORM_CHARS = 8
_HELD: weakref.WeakSet[Secret] = weakref.WeakSet()


class Secret:
    """A provider key; ``reveal()`` is the only way to read it. Every live one is scrubbed by ``scrub``."""

    __slots__ = ("__weakref__", "_value")

    def __init__(self, value: str) -> None:
        self._value = value
        _HELD.add(self)

    def reveal(self) -> str:
        """The key itself, for the one header that carries it upstream."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


class ProviderKeys:
    """Keys by provider name."""

    def __init__(self, keys: Mapping[str, Secret] | None = None) -> None:
        self._keys = dict(keys or {})

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ProviderKeys:
        """Keys from the given environment mapping (the broker's own, passed in by the caller)."""
        return cls({name: Secret(env[var]) for name, var in ENV_NAMES.items() if env.get(var)})

    @classmethod
    def from_file(cls, path: Path) -> ProviderKeys:
        """Keys from a JSON object file, refused unless only its owner can read it."""
        try:
            mode = path.stat().st_mode
        except FileNotFoundError as exc:
            raise ConfigError(f"key file {path.name} does not exist", field="key_file") from exc
        if stat.S_IMODE(mode) & 0o077:
            raise ConfigError(f"key file {path.name} must have mode 0600", field="key_file")
        try:
            data = json.loads(path.read_text("utf-8"))
        except (ValueError, UnicodeDecodeError):
            # not chained: a JSON error quotes the file's text, which could hold a key
            raise ConfigError(f"key file {path.name} is not a JSON object", field="key_file") from None
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            raise ConfigError(f"key file {path.name} must map provider names to strings", field="key_file")
        return cls({str(name): Secret(value) for name, value in data.items()})

    @staticmethod
    def write_file(path: Path, keys: Mapping[str, str]) -> None:
        """Create a key file with mode 0600 (``O_EXCL``: an existing file is never overwritten)."""
        try:
            write_secret_file(path, json.dumps(dict(keys)).encode())
        except FileExistsError as exc:
            raise ConfigError(f"key file {path.name} already exists", field="key_file") from exc

    def merged(self, other: ProviderKeys) -> ProviderKeys:
        """These keys, with ``other``'s taking precedence."""
        return ProviderKeys({**self._keys, **other._keys})

    def get(self, provider: str) -> Secret | None:
        """The key for ``provider``, if any."""
        return self._keys.get(provider)

    def values(self) -> list[str]:
        """Every key's value (for leak checks in tests and log scrubbing)."""
        return [secret.reveal() for secret in self._keys.values()]

    def __repr__(self) -> str:
        return f"ProviderKeys({sorted(self._keys)})"


def _base64_cores(data: bytes) -> list[str]:
    """The parts of the base64 of any text holding ``data`` that depend on ``data`` alone: at each of the three
    alignments, the characters whose six bits all come from ``data`` (the ones at the edges mix with
    whatever stands beside it)."""
    cores = []
    for shift in range(3):
        encoded = base64.b64encode(bytes(shift) + data).decode("ascii")
        start = -(-8 * shift // 6)  # the first character none of whose bits come from the padding in front
        end = 8 * (shift + len(data)) // 6  # past the last character whose bits all come from data
        cores.append(encoded[start:end])
    return cores


def _char_pattern(char: str) -> str:
    """A character, or any of the ways JSON and URLs escape it (``\\u00XX``, ``\\/``, ``%XX``, ``+``)."""
    ways = [re.escape(char)]
    code = ord(char)
    if code < 0x10000:
        ways.append(r"\\+u" + "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in f"{code:04x}"))
    short = {'"': '"', "\\": "\\", "/": "/", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}.get(char)
    if short is not None:
        ways.append(r"\\+" + re.escape(short))
    ways.append("".join("%" + "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in f"{byte:02x}")
                        for byte in char.encode("utf-8")))
    if char == " ":
        ways.append(r"\+")
    return "(?:" + "|".join(ways) + ")"


@functools.lru_cache(maxsize=64)
def _key_pattern(value: str) -> re.Pattern[str]:
    """One pattern for every form of a key: itself, hex, and the base64 (standard and URL-safe) of it at
    each alignment; each character of each form also JSON-escaped or URL-encoded."""
    data = value.encode("utf-8")
    forms = {value, data.hex()}
    for core in _base64_cores(data):
        forms |= {core, core.replace("+", "-").replace("/", "_")}
    alternatives = []
    # the key itself always; an encoded form only when long enough not to match ordinary text by chance
    for form in sorted((f for f in forms if f == value or len(f) >= _MIN_FORM_CHARS), key=len, reverse=True):
        hexed = form == data.hex()
        alternatives.append("".join(
            f"[{c}{c.upper()}]" if hexed and c.isalpha() else _char_pattern(c) for c in form))
    return re.compile("|".join(alternatives) or r"(?!)")


def scrub(text: str) -> str:
    """``text`` with every key this process holds replaced by ``***``, in every encoding ``_key_pattern``
    knows: for text from outside (an upstream's error body) before anyone else may read it."""
    for secret in list(_HELD):
        value = secret.reveal()
        if value:
            text = _key_pattern(value).sub(REDACTED, text)
    return text


def scrubbed(value: Any) -> Any:
    """A JSON value (an error body) with ``scrub`` applied to every string in it, keys of objects too."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {scrubbed(k): scrubbed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrubbed(v) for v in value]
    return value
