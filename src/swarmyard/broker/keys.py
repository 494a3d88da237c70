"""Provider keys: read from the broker's environment or from a key file created 0600 with ``O_EXCL``.

Keys never come from a worker. A ``Secret`` never shows its value in ``repr`` or ``str``, so a key cannot slip
into a log line or an error message by formatting.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from swarmyard.errors import ConfigError
from swarmyard.keys import write_secret_file

#: provider name -> environment variable holding its key.
ENV_NAMES: dict[str, str] = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "deepseek": "DEEPSEEK_API_KEY",
}


class Secret:
    """A provider key; ``reveal()`` is the only way to read it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

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


def default_key_file() -> Path:
    """Where ``swarmyard broker serve`` looks for a key file when none is given."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "swarmyard" / "provider-keys.json"
