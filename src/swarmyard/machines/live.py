"""The live machines of other processes on this host, found through the records their backends keep.

A machine lives in the process that made it (a Boxd script, a run), but every ready machine leaves a record,
``machine.json``, in its folder under the backend's root (``m/<folder>/``): its id, its name, the uid of the
process that made it and the host pid of its sandbox. With the folder's owner file (see
:mod:`swarmyard.machines.supervised`) that is enough for another process of the same user to find the machine by
name or id, freeze it with the cgroup freezer (the group is named after the folder) and read its disk from
outside, through the root of its sandbox's process, as ``swarmyard machines snapshot create NAME --from MACHINE``
does. A record whose owner or sandbox is gone is not a live machine.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from swarmyard.errors import ForbiddenError, InvalidInputError, NotFoundError, SandboxError
from swarmyard.machines.cgroups import MachineCgroups, discover
from swarmyard.machines.pids import alive, inside, read_owner, start_time

#: The record a ready machine's folder holds.
RECORD = "machine.json"
#: Present in a machine's folder while its owner has it paused (see :mod:`swarmyard.machines.pausing`): a copy
#: of its disk that froze it leaves it frozen.
PAUSED = "paused"


@dataclass(frozen=True, slots=True)
class LiveMachine:
    """One machine of some process on this host, as its record says."""

    id: str
    name: str
    #: the uid of the process that made it
    uid: int
    #: the host pid of the machine's sandbox process, and its start time (a pid plus this names one process)
    pid: int
    started: str
    #: how its disk is seen from outside: ``host`` (at ``disk`` itself), ``sandbox`` (``disk`` under the sandbox
    #: process's root: mounted in its mount namespace) or ``inside`` (``disk`` under the root of the first
    #: process of the machine's own mount namespace: a tmpfs it mounted itself)
    through: str
    disk: str
    #: the baseline (a snapshot's version) its disk lies on, if any
    baseline: str | None = None


def write_record(folder: Path, machine: LiveMachine) -> None:
    """Write the record of a machine that just became ready (atomically: a reader sees all of it or nothing)."""
    staged = folder / f".{RECORD}.tmp"
    staged.write_text(json.dumps(asdict(machine)))
    os.replace(staged, folder / RECORD)


def _records(root: Path) -> Iterator[tuple[Path, LiveMachine]]:
    base = root / "m"
    if not base.is_dir():
        return
    for folder in sorted(base.iterdir()):
        try:
            machine = LiveMachine(**json.loads((folder / RECORD).read_text()))
        except (OSError, ValueError, TypeError):
            continue  # not ready yet, being deleted, or no machine's
        owner = read_owner(folder / "owner")
        if owner is None or not alive(*owner) or start_time(machine.pid) != machine.started:
            continue  # its owner or its sandbox is gone: the orphan reaper's, not a live machine
        yield folder, machine


def machines(root: Path) -> list[LiveMachine]:
    """Every live machine under ``root``, of every process."""
    return [machine for _, machine in _records(root)]


def find(root: Path, ref: str) -> tuple[Path, LiveMachine]:
    """The live machine of this user named ``ref`` (its id or its name) under ``root``, with its folder.

    ``NotFoundError`` when none is; ``ForbiddenError`` when it is another user's; ``InvalidInputError`` when two
    live machines (of two processes) have that name.
    """
    if not isinstance(ref, str) or not ref:
        raise InvalidInputError("a machine is named by its id or its name", field="from")
    found = list(_records(root))
    by_id = [f for f in found if f[1].id == ref]
    chosen = by_id or [f for f in found if f[1].name == ref]
    if not chosen:
        raise NotFoundError("machine", ref)
    if len(chosen) > 1:
        raise InvalidInputError(f"{len(chosen)} live machines are named {ref!r}: name it by its id "
                                f"({', '.join(m.id for _, m in chosen)})", field="from")
    folder, machine = chosen[0]
    me = os.getuid()
    if machine.uid != me or folder.stat().st_uid != me:
        raise ForbiddenError(f"machine {ref} belongs to uid {machine.uid}, not to this user (uid {me})")
    return folder, machine


def disk_path(machine: LiveMachine, home: str) -> Path:
    """The machine's disk as this process sees it (``home``: its disk as the machine names it)."""
    if machine.through == "host":
        return Path(machine.disk)
    if machine.through == "sandbox":
        return Path(f"/proc/{machine.pid}/root") / machine.disk.lstrip("/")
    inner = inside(machine.pid)
    if inner is None:
        raise SandboxError(f"machine {machine.id} is not running", machine_id=machine.id)
    return Path(f"/proc/{inner}/root") / home.lstrip("/")


@contextlib.contextmanager
def frozen(folder: Path, machine: LiveMachine) -> Iterator[None]:
    """Keep the machine frozen (cgroup freezer) for a consistent copy of its disk; thawed after, unless it was
    paused already (its owner resumes it, not this)."""
    group = MachineCgroups(discover(), folder.name, adopt=True)
    if not group.can_freeze:
        raise SandboxError(f"machine {machine.id} has no cgroup v2 group to freeze for a consistent copy (see "
                           "swarmyard machines doctor)", machine_id=machine.id)
    was_frozen = group.frozen
    if not was_frozen:
        group.freeze(True)
    try:
        yield
    finally:
        # paused by its owner meanwhile: it stays so (the owner resumes it, not this)
        if not was_frozen and not (folder / PAUSED).exists():
            group.freeze(False)
