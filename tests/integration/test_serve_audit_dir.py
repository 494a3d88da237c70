"""``swarmyard serve --audit-dir DIR`` keeps the served store's audit log: checkpoints that ``swarmyard audit
verify DIR --store URL`` accepts, one keeper per folder, and only from a single serving process."""

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


def _env(folder: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8",
            "SWARMYARD_STATE_DIR": str(folder / "state")}


def _serve(folder: Path, name: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "swarmyard.cli", "serve", "--store", f"sqlite:///{folder / 'store.db'}",
            "--socket", str(folder / f"{name}.sock"), "--secret-file", str(folder / "secret"),
            "--operator-token-file", str(folder / "operator-token"), "--audit-dir", str(folder / "audit"), *extra]


def _cli(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swarmyard.cli", *args], env=_env(folder), cwd=folder,
                          capture_output=True, text=True, timeout=120)


def test_the_audit_log_of_a_served_store_verifies(folder: Path) -> None:
    refused = subprocess.run(_serve(folder, "many", "--workers", "2"), env=_env(folder), capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 1 and "--workers 1" in refused.stderr
    keeper = subprocess.Popen(_serve(folder, "a"), env=_env(folder), cwd=folder, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (folder / "a.sock").exists():  # readiness, bounded
            assert keeper.poll() is None, keeper.stderr.read() if keeper.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.05)
        second = subprocess.run(_serve(folder, "b"), env=_env(folder), capture_output=True, text=True, timeout=120)
        assert second.returncode == 1 and "kept by another swarmyard serve" in second.stderr, second.stderr
        remote = ["--server", str(folder / "a.sock"), "--operator-token-file", str(folder / "operator-token")]
        goal = _cli(folder, "goal", "create", "audit me", "--budget-usd", "1", "--call-cap", "5", *remote)
        assert goal.returncode == 0, goal.stderr
        task = _cli(folder, "task", "create", goal.stdout.strip(), "look", "--budget-usd", "0.5", *remote)
        assert task.returncode == 0, task.stderr
    finally:
        keeper.send_signal(signal.SIGTERM)
        assert keeper.wait(timeout=60) == 0
    verify = _cli(folder, "audit", "verify", str(folder / "audit"), "--store", f"sqlite:///{folder / 'store.db'}",
                  "--no-witness")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert verify.stdout.startswith("OK swarmyard.serve/") and "tables match" in verify.stdout
    # the log goes on where it stopped: a restarted keeper reopens it, checks it and signs past it
    again = subprocess.Popen(_serve(folder, "c"), env=_env(folder), cwd=folder, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (folder / "c.sock").exists():
        assert again.poll() is None, again.stderr.read() if again.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.05)
    remote = ["--server", str(folder / "c.sock"), "--operator-token-file", str(folder / "operator-token")]
    assert _cli(folder, "task", "create", goal.stdout.strip(), "look again", *remote).returncode == 0
    again.send_signal(signal.SIGTERM)
    assert again.wait(timeout=60) == 0
    verify = _cli(folder, "audit", "verify", str(folder / "audit"), "--store", f"sqlite:///{folder / 'store.db'}",
                  "--no-witness")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert len(list((folder / "audit" / "checkpoints").iterdir())) == 2
