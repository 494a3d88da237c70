"""A command run with its stderr on a terminal (a pty), as a user's shell would: rich draws its live view there."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


def run_on_a_terminal(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str],
                      wait_s: float = 600.0) -> tuple[int, bytes, bytes]:
    """Run ``argv`` with stdout piped and stderr on a pty until it closes the terminal or ends (reading for at
    most ``wait_s``); its exit code, its stdout and everything it drew on the terminal."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(list(argv), cwd=cwd, env=dict(env), stdout=subprocess.PIPE, stderr=follower)
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + wait_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
            elif proc.poll() is not None:
                break
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(leader)
    return proc.returncode, out, seen
