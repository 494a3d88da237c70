"""``swarmyard audit verify DIR --store URL`` on the very folder a ``swarmyard serve`` was given as
``--audit-dir DIR``, as the README says (it wanted the folder above it, and refused DIR with 'no audit/
folder')."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


@pytest.fixture
def folder(short_tmp: Path) -> Path:
    # short: Unix socket paths are limited
    (short_tmp / "state").mkdir(mode=0o700)
    return short_tmp


def _cli(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8",
           "SWARMYARD_STATE_DIR": str(folder / "state")}
    return subprocess.run([sys.executable, "-m", "swarmyard.cli", *args], env=env, cwd=folder,
                          capture_output=True, text=True, timeout=120)


def test_verify_takes_the_folder_serve_was_given(folder: Path) -> None:
    store, logs = f"sqlite:///{folder / 'db' / 'store.db'}", folder / "logs"
    (folder / "db").mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8",
           "SWARMYARD_STATE_DIR": str(folder / "state")}
    keeper = subprocess.Popen(
        [sys.executable, "-m", "swarmyard.cli", "serve", "--store", store, "--socket", str(folder / "p.sock"),
         "--secret-file", str(folder / "secret"), "--operator-token-file", str(folder / "operator-token"),
         "--audit-dir", str(logs)], env=env, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)
    try:
        deadline = time.monotonic() + 60
        while not (folder / "p.sock").exists():  # readiness, bounded
            assert keeper.poll() is None, keeper.stderr.read() if keeper.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.05)
        remote = ["--server", str(folder / "p.sock"), "--operator-token-file", str(folder / "operator-token")]
        goal = _cli(folder, "goal", "create", "audit me", "--budget-usd", "1", "--call-cap", "5", *remote)
        assert goal.returncode == 0, goal.stderr
    finally:
        keeper.send_signal(signal.SIGTERM)
        assert keeper.wait(timeout=60) == 0
    verify = _cli(folder, "audit", "verify", str(logs), "--store", store, "--no-witness")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert verify.stdout.startswith(f"OK swarmyard.serve{logs.resolve()} ") and "tables match" in verify.stdout
    assert "not witnessed" in verify.stdout
    # a log no witness cosigned is not OK unless the caller says it has none
    unwitnessed = _cli(folder, "audit", "verify", str(logs), "--store", store)
    assert unwitnessed.returncode == 1, unwitnessed.stdout + unwitnessed.stderr
    assert unwitnessed.stdout.startswith(f"BAD witness 0: no witness home has cosigned swarmyard.serve{logs.resolve()}")
    # a folder that is neither a run folder nor an audit log is still refused, saying what it wants
    (folder / "empty").mkdir()
    refused = _cli(folder, "audit", "verify", str(folder / "empty"), "--store", store)
    assert refused.returncode == 1 and "no audit/ folder" in refused.stderr
    # and without --store an audit folder alone names no store: refused, not guessed
    alone = _cli(folder, "audit", "verify", str(logs))
    assert alone.returncode == 1 and "no audit/ folder" in alone.stderr
