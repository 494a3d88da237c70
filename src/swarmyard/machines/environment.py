"""A machine's environment: an allow-list of harmless host variables plus what the caller passes, never os.environ."""

from __future__ import annotations

import functools
import os
import re
import site
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import swarmyard
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


@dataclass(frozen=True, slots=True)
class LeanPython:
    """How a Python swarmyard starts in every machine (the built-in agent) is started: ``argv`` (an interpreter and
    its flags, the module or code follows) and the variables to add to its exec's environment."""

    argv: tuple[str, ...]
    env: Mapping[str, str]


@functools.cache
def lean_python() -> LeanPython:
    """:data:`MACHINE_PYTHON` with ``-S``, where this interpreter's packages allow it, else :data:`MACHINE_PYTHON`.

    ``-S``: no ``site``, so none of the ``.pth`` files installed beside the packages runs in a machine. A line of
    one that starts with ``import`` is code run at every Python start (setuptools' distutils hook, a certificate
    hook that imports certifi and ``importlib.resources``): paid by every machine's agent, for nothing it uses.
    The packages are found instead on the ``PYTHONPATH`` given with it: the source root of a swarmyard that is
    not in site-packages (an editable install), then what ``site`` would have added (the site folders and the
    folders their ``.pth`` files name inside them; never the user site, as ``-s``). Those come before the
    standard library on ``sys.path``, where ``site`` puts them after it: when a site folder holds a module named
    as one of the standard library's, the agent starts with ``site`` as before.

    The first call also makes swarmyard's bytecode current (:func:`warm_bytecode`).
    """
    warm_bytecode()
    root = str(Path(swarmyard.__file__).resolve().parent.parent)
    return lean_python_for([os.path.realpath(f) for f in site.getsitepackages() if os.path.isdir(f)], root)


def warm_bytecode() -> None:
    """Write the bytecode of swarmyard's modules where it is missing or older than their source.

    A machine sees the package read-only: every agent would compile such a module again at its start (about 25 ms
    of CPU per agent for a source tree without bytecode, in each of hundreds of machines). Compiled here, not
    imported: an import writes none under ``PYTHONDONTWRITEBYTECODE`` (or ``-B``). About 6 ms when all of it is
    current; a folder this process cannot write is left as it is (its machines compile as before)."""
    import compileall

    compileall.compile_dir(Path(swarmyard.__file__).parent, quiet=2)


def lean_python_for(folders: list[str], root: str) -> LeanPython:
    """:func:`lean_python` for these site folders and a swarmyard found in ``root``."""
    stdlib = set(sys.stdlib_module_names)
    path: list[str] = []
    for folder in folders:
        names = {entry.split(".", 1)[0] for entry in os.listdir(folder)}
        if names & stdlib:
            return LeanPython(MACHINE_PYTHON, {})
        path.append(folder)
        path += _pth_folders(folder, folders)
    if root not in path:
        path.insert(0, root)
    return LeanPython((*MACHINE_PYTHON, "-S"), {"PYTHONPATH": os.pathsep.join(dict.fromkeys(path))})


def _pth_folders(folder: str, within: list[str]) -> list[str]:
    """The folders the ``.pth`` files of ``folder`` add (their lines that are not code), those inside ``within``:
    a machine sees no other (a swarmyard source root named by an editable install's is added apart)."""
    found: list[str] = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".pth"):
            continue
        try:
            lines = Path(folder, name).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            line = line.strip()
            if not line or line.startswith(("#", "import ", "import\t")):
                continue
            added = os.path.realpath(os.path.join(folder, line))
            if os.path.isdir(added) and any(added.startswith(w + os.sep) for w in within):
                found.append(added)
    return found
