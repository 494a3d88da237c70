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
from swarmyard.secret_files import write_secret_file

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


#: The characters JSON escapes with a backslash and a letter (or themselves).
_SHORT_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}


def _char_pattern(char: str) -> str:
    """A character, or any of the ways JSON and URLs escape it (``\\u00XX``, ``\\/``, ``%XX``, ``+``)."""
    ways = [re.escape(char)]
    code = ord(char)
    if code < 0x10000:
        ways.append(r"\\+u" + "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in f"{code:04x}"))
    short = _SHORT_ESCAPES.get(char)
    if short is not None:
        ways.append(r"\\+" + re.escape(short))
    ways.append("".join("%" + "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in f"{byte:02x}")
                        for byte in char.encode("utf-8")))
    if char == " ":
        ways.append(r"\+")
    return "(?:" + "|".join(ways) + ")"


def _widest(char: str) -> int:
    """The most characters one character of a form takes in the text ``_char_pattern`` matches, counting a
    JSON escape written at most twice (``\\\\u00XX``): a stream holds back this much to catch a split key."""
    return max(7 if ord(char) < 0x10000 else 1, 3 * len(char.encode("utf-8")))


def _forms_of(value: str) -> tuple[str, set[str]]:
    """A key's hex (matched in either case) and its other searched forms: itself, and the base64 (standard and
    URL-safe) of it at each alignment; an encoded form only when long enough not to match ordinary text by
    chance."""
    data = value.encode("utf-8")
    forms = {value}
    for core in _base64_cores(data):
        forms |= {core, core.replace("+", "-").replace("/", "_")}
    return data.hex(), {f for f in forms if f == value or len(f) >= _MIN_FORM_CHARS}


def _alternatives(value: str) -> list[tuple[str, str]]:
    """``(form, pattern)`` for every form of a key, each character of each form also JSON-escaped or
    URL-encoded (hex digits in either case)."""
    hexed, forms = _forms_of(value)
    out = [(form, "".join(_char_pattern(c) for c in form)) for form in forms]
    if len(hexed) >= _MIN_FORM_CHARS:
        out.append((hexed, "".join(f"[{c}{c.upper()}]" if c.isalpha() else _char_pattern(c) for c in hexed)))
    return out


class KeyForms:
    """Every form of a set of keys, compiled once: ``scrub`` for text, and what a stream must hold back.

    Scrubbing is on the hot path (every string of every answer), so text in which no form can occur is let
    through after a few substring tests: without a backslash, ``%`` or (for a key with a space) ``+`` only a
    form written out literally can match, and ``in`` finds that at memory speed; the pattern runs otherwise.
    """

    def __init__(self, values: tuple[str, ...]) -> None:
        alternatives = sorted((a for v in values for a in _alternatives(v)), key=lambda a: len(a[0]),
                              reverse=True)
        self._pattern = re.compile("|".join(p for _, p in alternatives)) if alternatives else None
        self._hexes = tuple(_forms_of(v)[0] for v in values)
        self._literals = tuple(f for v in values for f in _forms_of(v)[1])
        self._spaced = any(" " in v for v in values)
        # the escapes ``_char_pattern`` writes for the characters these forms hold (a backslash before an ``n``
        # is no escape of a key without a newline: code full of ``\\n`` takes the fast path)
        shorts = sorted({_SHORT_ESCAPES[c] for f, _ in alternatives for c in set(f) if c in _SHORT_ESCAPES})
        escapes = [r"\\u[0-9a-fA-F]{4}", r"%[0-9a-fA-F]{2}"]
        escapes += [r"\\[" + re.escape("".join(shorts)) + "]"] if shorts else []
        escapes += [r"\+"] if self._spaced else []
        self._escape = re.compile("|".join(escapes))
        self._lowered = tuple({f.lower() for f, _ in alternatives} | {v.lower() for v in values})
        #: the longest text one form may match written out literally, and with every character escaped
        self.longest_literal = max((len(f) for f, _ in alternatives), default=0)
        self.longest_match = max((sum(_widest(c) for c in f) for f, _ in alternatives), default=0)

    def escaped(self, text: str) -> bool:
        """Whether ``text`` holds an escape some character of some form may be written with."""
        if "\\" not in text and "%" not in text and not (self._spaced and "+" in text):
            return False
        return self._escape.search(text) is not None

    def _may_hold(self, text: str) -> bool:
        if self.escaped(text) or any(form in text for form in self._literals):
            return True
        lowered = text.lower()
        return any(hexed in lowered for hexed in self._hexes)

    def scrub(self, text: str) -> str:
        """``text`` with every form of every key replaced by ``***``."""
        if self._pattern is None or not self._may_hold(text):
            return text
        return self._pattern.sub(REDACTED, text)

    def scrubbed(self, value: Any) -> Any:
        """A JSON value with ``scrub`` applied to every string in it, keys of objects too."""
        if self._pattern is None:
            return value  # no key held: nothing to walk
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, dict):
            return {self.scrubbed(k): self.scrubbed(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.scrubbed(v) for v in value]
        return value

    def first_possible_start(self, text: str) -> int:
        """Where the shortest end of ``text`` that could begin a form of a key starts (``len(text)`` when none
        could): what comes before it holds no part of a key, whatever followed. Text with an escape in its last
        ``longest_match`` characters could begin one anywhere there."""
        if self._pattern is None:
            return len(text)
        if self.escaped(text[-self.longest_match:]):
            return max(0, len(text) - self.longest_match)
        lowered = text.lower()
        for start in range(max(0, len(text) - self.longest_literal), len(text)):
            if any(form.startswith(text[start:]) for form in self._literals) or any(
                    hexed.startswith(lowered[start:]) for hexed in self._hexes):
                return start
        return len(text)

    def shares_piece(self, text: str, size: int = 6) -> bool:
        """Whether any ``size`` characters of ``text`` (all of it, if shorter) occur, in any case, in a form of
        a key: such text may carry part of one even where no whole form shows."""
        lowered = text.lower()
        windows = {lowered[i:i + size] for i in range(max(1, len(lowered) - size + 1))}
        return any(window in form for form in self._lowered for window in windows)


@functools.lru_cache(maxsize=16)
def _compiled(values: tuple[str, ...]) -> KeyForms:
    return KeyForms(values)


def held_values() -> list[str]:
    """The value of every key this process holds now (what the end-of-run scan looks for in machines)."""
    return sorted({value for secret in list(_HELD) if (value := secret.reveal())})


def held_forms() -> KeyForms:
    """The forms of every key this process holds now (compiled once per set of keys)."""
    return _compiled(tuple(sorted({value for secret in list(_HELD) if (value := secret.reveal())})))


def scrub(text: str) -> str:
    """``text`` with every key this process holds replaced by ``***``, in every encoding ``_alternatives``
    knows: for text from outside (an upstream's answer or error body) before anyone else may read it."""
    return held_forms().scrub(text)


def scrubbed(value: Any) -> Any:
    """A JSON value (an upstream's answer, an error body) with ``scrub`` applied to every string in it, keys of
    objects too."""
    return held_forms().scrubbed(value)
