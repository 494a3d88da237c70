"""A process named by its pid and its start time, as this host's ``/proc`` shows it: whether it still lives, the
owner file a machine's or an embedded plane's folder keeps, and the first process below it in a namespace of its own.

Both the backends that run machines (:mod:`swarmyard.machines.supervised`) and the readers of their folders from
another process (:mod:`swarmyard.machines.live`, the ``Boxd`` client's plane reaper) use these; they import
nothing of this package.
"""

from __future__ import annotations

import os
from pathlib import Path


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat): a pid plus this names one process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def owner_line() -> str:
    """This process, as a machine folder's owner file names it."""
    return f"{os.getpid()} {start_time(os.getpid())}\n"


def read_owner(path: Path) -> tuple[int, str] | None:
    """The (pid, start time) an owner file names; ``None`` when it is missing or not one."""
    try:
        pid, started = path.read_text().split()
        return int(pid), started
    except (OSError, ValueError):
        return None


def alive(pid: int, started: str) -> bool:
    """Whether the process ``pid`` that started at ``started`` still runs (not another one given its pid since)."""
    return start_time(pid) == started


def inside(pid: int, namespace: str = "mnt") -> int | None:
    """The first process at or below ``pid`` in another ``namespace`` (``mnt``, ``net``) than this one's: bwrap's
    sandbox side (a parked launcher has a mount namespace of its own, but not the machine's network one)."""
    own = os.readlink(f"/proc/self/ns/{namespace}")
    todo = [pid]
    while todo:
        current = todo.pop(0)
        try:
            if os.readlink(f"/proc/{current}/ns/{namespace}") != own:
                return current
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue  # ended while we looked
        todo += [int(child) for child in children]
    return None


__all__ = ["alive", "inside", "owner_line", "read_owner", "start_time"]
