"""Fork with memory: whether a fork can carry its source's running processes, and why not when it cannot.

A fork always copies its source's disk. Carrying the source's process tree with its memory as well takes a
checkpoint of the sandbox's processes and a restore of them in the fork's sandbox: CRIU (checkpoint/restore in
userspace) is the known way. It needs root, a CRIU that runs on this kernel (``criu check``) and a backend that
restores a bubblewrap sandbox's tree (its pid and mount namespaces, its seccomp filter, its Landlock rules, its
cgroup) into the fork's sandbox. The local backend does not restore one yet, so every fork keeps the disk only, and
its result says so with the reason (``MachineInfo.fork_memory_reason``), never silently.

The probe runs ``criu check`` once per process (it takes tens of milliseconds and the answer does not change while
the kernel does not): the reason a user reads names what failed first, the missing binary, the missing privilege or
CRIU's own words, so the fix is clear.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

#: How to get CRIU where it is missing (Debian and Ubuntu).
CRIU_HINT = "apt-get install -y criu"
#: What ``criu check`` may take at most; it answers in well under a second on a quiet host.
CHECK_TIMEOUT_S = 30.0
#: The environment ``criu check`` runs with: nothing of the caller's (no keys), a PATH for the tools it runs.
_CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
#: CRIU's error lines: ``Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds``.
_ERROR = re.compile(r"^(?:\([0-9.]+\) )?Error \([^)]*\): (?P<what>.+)$")
#: What the local backend cannot do yet even where CRIU works: said as it is, so nobody takes it for a bug.
NO_RESTORE = (
    "this backend does not yet restore a sandbox's process tree into its fork (a bubblewrap sandbox's pid 1 "
    "maps bwrap from outside the sandbox, which CRIU cannot dump, and a restored tree must keep its seccomp "
    "filter and Landlock rules)"
)
#: The process backend's machines are plain host processes: nothing to checkpoint apart from the host.
NO_SANDBOX = "the process backend has no sandbox whose processes could be checkpointed"


@dataclass(frozen=True, slots=True)
class ForkMemory:
    """What a fork carried besides the disk: ``kept`` its source's processes and memory, or ``reason`` why not."""

    kept: bool
    reason: str | None = None

    def __post_init__(self) -> None:
        if not self.kept and not self.reason:
            raise ValueError("a fork that kept the disk only says why")


def criu_path() -> str | None:
    """The ``criu`` binary on the caller's ``PATH``, or ``None``."""
    return shutil.which("criu")


def criu_refusal(criu: str | None, euid: int) -> str | None:
    """Why CRIU cannot checkpoint a machine here (``None``: ``criu check`` passes). ``criu``: its path, if any."""
    if criu is None:
        return f"CRIU is not installed ({CRIU_HINT})"
    if euid != 0:
        return f"CRIU needs root to checkpoint and restore a sandbox, and this process runs as uid {euid}"
    try:
        done = subprocess.run([criu, "check"], capture_output=True, env=_CLEAN_ENV, timeout=CHECK_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return f"`criu check` did not answer within {CHECK_TIMEOUT_S:g} s"
    except OSError as exc:
        return f"`{criu} check` could not run: {exc.strerror or exc}"
    if done.returncode == 0:
        return None
    return f"`criu check` fails on this kernel: {_criu_errors(done.stdout + done.stderr)}"


def _criu_errors(output: bytes) -> str:
    """CRIU's own error lines, the first that say what failed (not its 'exited, status=1' about its helpers)."""
    found: list[str] = []
    for line in output.decode("utf-8", "replace").splitlines():
        match = _ERROR.match(line.strip())
        if match and not match["what"].startswith(("exited, status", "execvp(")):
            found.append(match["what"].strip())
    if not found:
        tail = output.decode("utf-8", "replace").strip().splitlines()
        return tail[-1][:300] if tail else "no output"
    return "; ".join(found[:2])[:300]


@functools.cache
def _local_refusal() -> str:
    refusal = criu_refusal(criu_path(), os.geteuid())
    return NO_RESTORE if refusal is None else refusal


def fork_memory(backend: str) -> ForkMemory:
    """What a fork made by ``backend`` (a backend's name) carries besides its disk on this host."""
    if backend == "process":
        return ForkMemory(False, NO_SANDBOX)
    return ForkMemory(False, _local_refusal())
