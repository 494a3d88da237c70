"""The goal, task, board and budget commands against a running control plane (``--server``) agree with the store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.store import open_store


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run([sys.executable, "-m", "swarmyard.cli", *args], capture_output=True, text=True, env=env,
                          check=check, timeout=120)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path, str]]:
    folder = Path(tempfile.mkdtemp(prefix="sy-cli-", dir="/tmp"))  # short: Unix socket paths are limited
    sock, token, store = folder / "plane.sock", folder / "operator-token", f"sqlite:///{tmp_path / 'store.db'}"
    proc = subprocess.Popen([sys.executable, "-m", "swarmyard.cli", "serve", "--socket", str(sock), "--store", store,
                             "--secret-file", str(folder / "secret"), "--operator-token-file", str(token)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (sock.exists() and token.exists()):  # wait for readiness, bounded
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "control plane did not start"
        time.sleep(0.05)
    try:
        yield str(sock), token, store
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def test_commands_through_the_operator_api(server: tuple[str, Path, str]) -> None:
    sock, token, store = server
    remote = ["--server", sock, "--operator-token-file", str(token)]
    goal_id = _cli("goal", "create", "find the bug", "--budget-usd", "1.5", "--call-cap", "10", *remote).stdout.strip()
    task_id = _cli("task", "create", goal_id, "read the logs", "--budget-usd", "0.5", *remote).stdout.strip()
    local = open_store(store)
    try:
        assert local.get_goal(goal_id).budget_micro_usd == 1_500_000
        assert local.get_task(task_id).envelope.limit == 500_000
        goals = json.loads(_cli("goal", "list", "--json", *remote).stdout)
        assert [g["id"] for g in goals] == [goal_id]
        tasks = json.loads(_cli("task", "list", goal_id, "--json", *remote).stdout)
        assert [(t["id"], t["state"]) for t in tasks] == [(task_id, "pending")]
        assert json.loads(_cli("board", "read", goal_id, "--json", *remote).stdout) == []
        budget = json.loads(_cli("budget", "show", goal_id, "--json", *remote).stdout)
        assert budget["available"] == 1_500_000 and budget["tasks"][task_id]["limit"] == 500_000
    finally:
        local.close()
    # A refusal from the server is one typed line and exit 1; nothing is created.
    bad = _cli("task", "create", goal_id, "too big", "--budget-usd", "5", *remote, check=False)
    assert bad.returncode == 1 and "budget_exceeded" in bad.stderr
    wrong = _cli("goal", "list", "--server", sock, "--operator-token-file", str(token.with_name("missing")),
                 check=False)
    assert wrong.returncode == 1 and "operator token" in wrong.stderr
