"""A run's service children (its evaluator, its witness): a process that prints one JSON line once it is ready
and stops on SIGTERM or when its stdin ends. Each caller raises its own typed error; this is what they share."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

from swarmyard.errors import InvalidInputError, SwarmyardError


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


def bind_socket(path: Path, mode: int, gid: int, taken: Callable[[Path], SwarmyardError]) -> socket.socket:
    """Bind and listen on the service's Unix socket at ``path`` with ``mode`` (as root, group ``gid``).

    A stale socket of a service that is gone is replaced; one that answers is another server's (``taken(path)``
    is raised), and anything else at the path is refused. The socket is private from its first moment (a umask),
    before its mode opens it to the group.
    """
    if path.is_symlink() or path.exists():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise InvalidInputError(f"{path} exists and is not a socket", field="socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # a stale socket of a server that is gone
        else:
            raise taken(path)
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old_umask)
    os.chmod(path, mode)
    if os.geteuid() == 0:
        os.chown(path, 0, gid)
    sock.listen(128)
    return sock
