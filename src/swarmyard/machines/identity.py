"""Who a machine is on the host: a uid and gid no account has, so the invoker's private files stay private.

bwrap's own user namespace maps the sandbox's uid to the invoking uid, so every 0600 file of the invoker that a
bind exposed would be readable inside. When this process is root, machines instead join one user namespace made
here with two entries: root to root (bwrap needs it to set the sandbox up, and the init drops it at once) and the
sandbox's uid 1000 to :data:`HOST_UID`, an id no account on the host has. Inside, the invoker's files belong to
uid 0 and "other" is what a machine gets: a 0600 file is unreadable even if a bind slips through.

A process that is not root cannot write a map with a second entry (that needs ``CAP_SETUID`` on the host), so its
machines keep bwrap's single mapping; :func:`private_userns` then answers ``None``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path

from swarmyard.errors import SandboxError

_log = logging.getLogger(__name__)
#: The machine's uid and gid as its processes see them.
SANDBOX_UID = 1000
#: The host uid and gid the sandbox's 1000 maps to: owned by no account (checked at first use).
HOST_UID = 100_000_000

_LOCK = threading.Lock()
_USERNS: list[int | None] = []


def private_userns() -> int | None:
    """A descriptor of the shared user namespace with the two-entry map, made at first use; ``None`` when this
    process cannot make one (not root, no ``unshare``)."""
    with _LOCK:
        if not _USERNS:
            _USERNS.append(_make())
        return _USERNS[0]


def _make() -> int | None:
    if os.geteuid() != 0:
        return None
    unshare = shutil.which("unshare", path="/usr/bin:/bin")
    if unshare is None or _host_has(HOST_UID):
        _log.warning("machines run as this process's uid on the host: %s",
                     "util-linux's unshare is missing" if unshare is None else f"uid {HOST_UID} is taken")
        return None
    # The helper makes the namespace and waits on its stdin; this process writes the maps from outside it.
    helper = subprocess.Popen(
        [unshare, "--user", "--", "/bin/sh", "-c", "echo ready; exec head -c1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert helper.stdin is not None and helper.stdout is not None
    try:
        if helper.stdout.readline() != b"ready\n":
            return None
        proc = Path(f"/proc/{helper.pid}")
        mapping = f"0 0 1\n{SANDBOX_UID} {HOST_UID} 1\n".encode()
        for name in ("uid_map", "gid_map"):
            fd = os.open(proc / name, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, mapping)
            finally:
                os.close(fd)
        return os.open(proc / "ns" / "user", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            helper.stdin.close()
        helper.wait()
        helper.stdout.close()


def _host_has(uid: int) -> bool:
    import grp
    import pwd

    try:
        pwd.getpwuid(uid)
    except KeyError:
        pass
    else:
        return True
    try:
        grp.getgrgid(uid)
    except KeyError:
        return False
    return True


def admit(socket_path: Path) -> None:
    """Let machines connect to a Unix socket bound into them: its group becomes the sandbox's, with read-write.

    The socket's folder still keeps everyone else on the host out; nothing changes when machines are not remapped.
    """
    if private_userns() is None:
        return
    try:
        info = os.stat(socket_path)
        if info.st_gid != HOST_UID:
            os.chown(socket_path, -1, HOST_UID)
        if info.st_mode & 0o060 != 0o060:
            os.chmod(socket_path, (info.st_mode & 0o7777) | 0o060)
    except OSError as exc:
        raise SandboxError(f"machines cannot be let reach the socket {socket_path}: {exc}") from exc
