"""A machine's environment: an allow-list of harmless host variables plus what the caller passes, never os.environ."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping

from swarmyard.errors import InvalidInputError

#: Host variables copied into a machine when set; nothing else from the host's environment ever is.
HOST_ALLOW_LIST: tuple[str, ...] = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def validate(env: Mapping[str, str], *, field: str = "env") -> dict[str, str]:
    """Check names and values, returning a plain dict; raises :class:`InvalidInputError` on bad input."""
    clean: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not _NAME.match(key):
            raise InvalidInputError(f"environment variable name {key!r} is not valid", field=field)
        if not isinstance(value, str) or "\0" in value:
            raise InvalidInputError(f"environment variable {key} must be a string without NUL", field=field)
        clean[key] = value
    return clean


def build(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed host variables, then the backend's ``base``, then the caller's ``extra``."""
    env = {key: os.environ[key] for key in HOST_ALLOW_LIST if key in os.environ}
    env.update(base)
    env.update(extra)
    return env


#: The bin folder of the Python environment swarmyard runs in (a virtual environment's own, not its resolved
#: interpreter's): first on a machine's PATH, so ``python3`` in a machine has the same packages as swarmyard.
ENV_BIN = os.path.dirname(os.path.abspath(sys.executable))
#: How every Python swarmyard starts in a machine begins (the agent, ``swarmyard mcp``, the launcher's helpers):
#: with neither the working folder (``-P``) nor the user site under ``$HOME`` (``-s``) on ``sys.path``. Both are
#: the machine's own disk, writable by whatever ran there: an ``httpx.py`` in the home, or a ``.pth`` file under
#: ``~/.local``, would run inside the next process before it locks anything. Not ``-I``: it drops ``PYTHONPATH``
#: too, which a machine is given when swarmyard comes from a source folder.
MACHINE_PYTHON: tuple[str, ...] = (sys.executable, "-P", "-s")
