"""A run's service children (its evaluator, its witness): a process that prints one JSON line once it is ready
and stops on SIGTERM or when its stdin ends. Each caller raises its own typed error; this is what they share."""

from __future__ import annotations

import selectors
import signal
import subprocess
from pathlib import Path


def ready_line(proc: subprocess.Popen[bytes], timeout_s: float) -> bytes:
    """The child's first line of stdout, or ``b""`` if none came within ``timeout_s`` (or it exited first)."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        ready = selector.select(timeout=timeout_s)
    return proc.stdout.readline() if ready else b""


def why_not_started(proc: subprocess.Popen[bytes], log: Path) -> str:
    """The last line of the child's log, or its exit status: what a refusal to start says."""
    tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:] if log.exists() else []
    return tail[0] if tail else f"exit {proc.returncode}"


def stop(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Close its stdin, SIGTERM it, SIGKILL it after ``timeout_s``, and close its stdout."""
    if proc.stdin is not None:
        proc.stdin.close()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
