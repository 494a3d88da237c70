"""Runs on the embedded model: a CLI run to its end, stopped only when it stops making progress, and the
environment such a run gets (a user's, with no key, and a cache folder that already holds the assembled model).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import pytest


def _footprint(folder: Path) -> int:
    """Bytes under ``folder``: the run's store, logs and agent outputs all grow while it makes progress."""
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            total += path.stat().st_size
    return total


def run_while_progressing(argv: list[str], *, cwd: Path, env: dict[str, str],
                          idle_s: float = 300.0) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to its end, killing it only when nothing it writes has grown for ``idle_s`` seconds.

    A run on a busy 2-core machine may take several times its quiet duration; what it must not do is stall.
    """
    out, err = cwd / "run.stdout", cwd / "run.stderr"
    with out.open("wb") as out_f, err.open("wb") as err_f:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out_f, stderr=err_f)
        seen, last_change = -1, time.monotonic()
        while True:
            try:
                proc.wait(timeout=2.0)
                break
            except subprocess.TimeoutExpired:
                now_seen = _footprint(cwd)
                if now_seen != seen:
                    seen, last_change = now_seen, time.monotonic()
                elif time.monotonic() - last_change > idle_s:
                    proc.kill()
                    proc.wait()
                    pytest.fail(f"the run made no progress for {idle_s:.0f} s: {err.read_text()[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out.read_text(), err.read_text())


def model_env(folder: Path) -> dict[str, str]:
    """A clean environment, as a user's shell gives (no provider key, never the test runner's own), whose user
    cache folder (``XDG_CACHE_HOME``) is ``folder``'s own and links to the assembled default model.

    The model is assembled once for the host (half a gigabyte joined and hashed) and only linked here, so a run
    does not assemble it again into a fresh home; the run's saved prompt starts go to ``folder``'s cache and
    start empty, as on a new host, and the user's cache is left alone."""
    from swarmyard.bench.agents import cache_with_model

    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8",
            "XDG_CACHE_HOME": str(cache_with_model(folder))}
