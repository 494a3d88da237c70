"""The CLI in a subprocess, as a user runs it: this interpreter, in a folder of the test's, with a small
environment of its own (never this process's whole environment, which could hold a provider's key)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

#: The CLI's entry point, as ``python -c`` runs it (the console script calls the same).
CLI = "from swarmyard.cli.main import main; main()"


def cli_env(home: Path, **extra: str) -> dict[str, str]:
    """PATH, HOME (``home``), LANG and, where this process has one, PYTHONPATH (swarmyard as this interpreter
    finds it); ``extra`` added."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return {**env, **extra}


def run_cli(*args: str, cwd: Path, env: Mapping[str, str] | None = None,
            timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    """``swarmyard ARGS`` run in ``cwd`` to its end, its output captured as text; ``env`` defaults to
    :func:`cli_env` of ``cwd``."""
    return subprocess.run([sys.executable, "-c", CLI, *args], cwd=cwd, env=dict(cli_env(cwd) if env is None else env),
                          capture_output=True, text=True, timeout=timeout_s)
