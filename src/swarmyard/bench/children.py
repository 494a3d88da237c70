"""Child processes of the benchmarks (servers, upstreams, client processes): their environment and their end."""

from __future__ import annotations

import os
import subprocess


def child_env() -> dict[str, str]:
    """Only what a Python child needs; never the whole environment (it may hold provider keys)."""
    return {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "PYTHONPATH", "VIRTUAL_ENV") if k in os.environ}


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a child, killing it if it has not ended within 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
