"""Per-machine cgroups: v1 controllers (memory, pids, cpu) or v2 ones where present, and v2's ``cgroup.kill``.

The backend's child writes ``0`` (itself) into every ``cgroup.procs`` before it execs bwrap, so the whole sandbox
starts inside its limits with no window. Teardown kills the whole group at once with ``cgroup.kill`` where the
host has it (kernel 5.14+: the kernel also kills what forks meanwhile), else freezes the group (v2 freezer, so
nothing forks while it is emptied) and SIGKILLs each listed process; then it waits until the kernel says the group
is empty (``populated 0`` in ``cgroup.events``, which wakes a ``poll`` when it changes: no sleeping) and removes
the folders, or says it could not.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from swarmyard.errors import SandboxError
from swarmyard.machines.protocol import Limits

_ROOT = Path("/sys/fs/cgroup")
_CPU_PERIOD_US = 100_000


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """Where this host's cgroup controllers live, as seen from this process's own groups."""

    v1: dict[str, Path] = field(default_factory=dict)
    v2: Path | None = None
    v2_controllers: frozenset[str] = frozenset()
    v2_kill: bool = False

    def controllers(self) -> set[str]:
        """Resource controllers usable for limits: memory, pids, cpu."""
        return {c for c in ("memory", "pids", "cpu") if c in self.v1 or c in self.v2_controllers}


def discover(mounts: Path = Path("/proc/self/mounts"), own: Path = Path("/proc/self/cgroup")) -> Hierarchy:
    """Read the mount table and this process's cgroups; empty when there is nothing writable."""
    paths: dict[str, str] = {}
    for line in own.read_text().splitlines():
        _, names, path = line.split(":", 2)
        for name in names.split(",") if names else [""]:
            paths[name] = path
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in mounts.read_text().splitlines():
        _, where, kind, options, *_ = line.split()
        if kind == "cgroup2":
            v2 = Path(where) / paths.get("", "/").lstrip("/")
        elif kind == "cgroup":
            for controller in ("memory", "pids", "cpu"):
                if controller in options.split(",") and controller in paths:
                    v1.setdefault(controller, Path(where) / paths[controller].lstrip("/"))
    controllers: frozenset[str] = frozenset()
    kill = False
    if v2 is not None and os.access(v2, os.W_OK):
        with contextlib.suppress(OSError):
            controllers = frozenset((v2 / "cgroup.controllers").read_text().split()) - set(v1)
        # The root cgroup has no cgroup.kill file; every child of it does on kernels >= 5.14.
        kill = (v2 / "cgroup.kill").exists() or _kernel_at_least(5, 14)
    else:
        v2 = None
    v1 = {k: p for k, p in v1.items() if os.access(p, os.W_OK)}
    return Hierarchy(v1=v1, v2=v2, v2_controllers=controllers, v2_kill=kill)


def group_folders(hierarchy: Hierarchy, name: str) -> list[Path]:
    """Every folder a machine's groups named ``name`` can have, existing or not (v2 first)."""
    folders = [hierarchy.v2 / "swarmyard" / name] if hierarchy.v2 is not None else []
    return folders + [path / "swarmyard" / name for path in hierarchy.v1.values()]


def remove_orphan(hierarchy: Hierarchy, name: str) -> None:
    """Kill whatever is left in the groups named ``name`` (their owner died) and remove them."""
    orphan = MachineCgroups(hierarchy, name, adopt=True)
    if orphan.dirs:
        with contextlib.suppress(SandboxError):
            orphan.kill()
        with contextlib.suppress(SandboxError):  # what survives is tried again by the next reaper
            orphan.remove()


def wanted_controllers(limits: Limits) -> set[str]:
    """The controllers ``limits`` needs."""
    wanted = {"memory": limits.memory_bytes, "pids": limits.pids, "cpu": limits.cpus}
    return {k for k, v in wanted.items() if v is not None}


#: Groups a machine gets where the host allows, whatever its limits: with a cpu group of its own a machine is one
#: entity to the CPU scheduler (a fork bomb's 500 processes weigh as one machine, not as 500 of the host's), and
#: its teardown can raise its weight so the processes it kills get the CPU time they need to exit (see ``kill``).
#: A host that refuses one is no error: no limit needs it.
OPTIONAL_CONTROLLERS = frozenset({"cpu"})


def _kernel_at_least(major: int, minor: int) -> bool:
    parts = os.uname().release.split(".")
    try:
        return (int(parts[0]), int(parts[1])) >= (major, minor)
    except (IndexError, ValueError):
        return False


class MachineCgroups:
    """The cgroups of one machine: created, given its limits, joined by the sandbox, killed and removed at delete.

    ``controllers`` says which groups to make (by default those ``limits`` needs); a launcher parked ahead of
    demand (see :mod:`swarmyard.machines.launchers`) gets groups for every controller the host has, joins them
    at once and has the machine's limits written by :meth:`apply` when a machine takes it.
    """

    def __init__(
        self,
        hierarchy: Hierarchy,
        name: str,
        limits: Limits | None = None,
        *,
        controllers: set[str] | None = None,
        adopt: bool = False,
    ) -> None:
        """``adopt``: take the groups named ``name`` that already exist (to tear them down) instead of making them."""
        self.name = name
        #: this process's own groups (v2 first), where ``spare`` moves a process
        self._homes = ([hierarchy.v2] if hierarchy.v2 is not None else []) + list(hierarchy.v1.values())
        #: processes ``spare`` moved out, which ``kill`` leaves alone
        self._spared: set[int] = set()
        self.dirs: list[Path] = []
        self.kill_file: Path | None = None
        self.enforced: set[str] = set()
        #: controller -> (version, its group folder)
        self._groups: dict[str, tuple[int, Path]] = {}
        #: The limits written so far (``None``: none yet).
        self.limits: Limits | None = None
        if adopt:
            self.dirs = [folder for folder in group_folders(hierarchy, name) if folder.is_dir()]
            if hierarchy.v2 is not None and hierarchy.v2_kill and self.dirs and self.dirs[0].parent.parent == hierarchy.v2:
                self.kill_file = self.dirs[0] / "cgroup.kill"
            for folder in self.dirs:  # its cpu group, whose weight the teardown raises
                if folder.parent.parent == hierarchy.v1.get("cpu"):
                    self._groups["cpu"] = (1, folder)
                elif folder.parent.parent == hierarchy.v2 and "cpu" in hierarchy.v2_controllers:
                    self._groups["cpu"] = (2, folder)
            return
        if controllers is None:
            controllers = set() if limits is None else wanted_controllers(limits)
        try:
            self._create(hierarchy, controllers & hierarchy.controllers())
            if limits is not None:
                self.apply(limits)
        except OSError as exc:
            with contextlib.suppress(SandboxError):  # the error being raised is the one to tell
                self.remove()
            raise SandboxError(f"cannot create cgroups for {name}: {exc}") from exc

    def _create(self, hierarchy: Hierarchy, controllers: set[str]) -> None:
        optional = (OPTIONAL_CONTROLLERS & hierarchy.controllers()) - controllers
        if hierarchy.v2 is not None:
            group = self._mkdir(hierarchy.v2 / "swarmyard" / self.name)
            if hierarchy.v2_kill:
                self.kill_file = group / "cgroup.kill"
            for controller in sorted(hierarchy.v2_controllers & (controllers | optional)):
                try:
                    (group.parent / "cgroup.subtree_control").write_text(f"+{controller}")
                except OSError:
                    if controller in optional:
                        continue
                    raise
                self._groups[controller] = (2, group)
        for controller in sorted((controllers | optional) - set(self._groups)):
            if controller in hierarchy.v1:
                try:
                    self._groups[controller] = (1, self._mkdir(hierarchy.v1[controller] / "swarmyard" / self.name))
                except OSError:
                    if controller not in optional:
                        raise

    def apply(self, limits: Limits) -> None:
        """Write ``limits`` into the groups (before any process of the machine runs); raises :class:`SandboxError`.

        Writes only what differs from the limits applied before (a parked launcher's groups come with the
        default limits, so a machine with the defaults costs no write); ``None`` lifts a limit set earlier.
        """
        before = self.limits or Limits(memory_bytes=None, pids=None, cpus=None)
        try:
            self._apply(limits, before)
        except OSError as exc:
            raise SandboxError(f"cannot set the limits of {self.name}: {exc}") from exc
        self.limits = limits

    def _apply(self, limits: Limits, before: Limits) -> None:
        if limits.memory_bytes != before.memory_bytes and "memory" in self._groups:
            version, group = self._groups["memory"]
            value = limits.memory_bytes
            if version == 2:
                (group / "memory.max").write_text("max" if value is None else str(value))
                with contextlib.suppress(OSError):
                    (group / "memory.swap.max").write_text("max" if value is None else "0")
            else:
                # memsw must stay >= the limit at every step: lift it, set the limit, then bring it down.
                # Without a memsw limit the sandbox could spill past its limit into swap.
                with contextlib.suppress(OSError):
                    (group / "memory.memsw.limit_in_bytes").write_text("-1")
                (group / "memory.limit_in_bytes").write_text("-1" if value is None else str(value))
                if value is not None:
                    with contextlib.suppress(OSError):
                        (group / "memory.memsw.limit_in_bytes").write_text(str(value))
        if limits.pids != before.pids and "pids" in self._groups:
            (self._groups["pids"][1] / "pids.max").write_text("max" if limits.pids is None else str(limits.pids))
        if limits.cpus != before.cpus and "cpu" in self._groups:
            version, group = self._groups["cpu"]
            quota = None if limits.cpus is None else int(limits.cpus * _CPU_PERIOD_US)
            if version == 2:
                (group / "cpu.max").write_text(f"{'max' if quota is None else quota} {_CPU_PERIOD_US}")
            else:
                (group / "cpu.cfs_period_us").write_text(str(_CPU_PERIOD_US))
                (group / "cpu.cfs_quota_us").write_text(str(-1 if quota is None else quota))
        wanted = {"memory": limits.memory_bytes, "pids": limits.pids, "cpu": limits.cpus}
        self.enforced = {c for c, v in wanted.items() if v is not None and c in self._groups}

    def _mkdir(self, path: Path) -> Path:
        path.parent.mkdir(exist_ok=True)
        path.mkdir()
        self.dirs.append(path)
        return path

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files the sandbox's first process writes itself into."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def pids(self) -> set[int]:
        """Every process still in any of the machine's groups."""
        found: set[int] = set()
        for directory in self.dirs:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
        return found

    def _v2_group(self) -> Path | None:
        """The machine's cgroup v2 group: every one has ``cgroup.freeze`` and ``cpu.stat``, whatever controllers
        are enabled in it (kernel 5.2+)."""
        for directory in self.dirs:
            if (directory / "cgroup.freeze").exists():
                return directory
        return None

    @property
    def can_freeze(self) -> bool:
        """Whether this machine can be paused (it has a v2 group with the freezer)."""
        return self._v2_group() is not None

    @property
    def frozen(self) -> bool:
        """Whether the machine is frozen (or being frozen) now."""
        group = self._v2_group()
        try:
            return group is not None and (group / "cgroup.freeze").read_text().strip() == "1"
        except OSError:
            return False

    def freeze(self, frozen: bool, deadline_s: float = 10.0) -> None:
        """Freeze (or thaw) every process of the machine, returning once the kernel says it is done.

        A frozen process is never scheduled: it uses no CPU, keeps its memory and resumes where it stopped.
        """
        group = self._v2_group()
        if group is None:
            raise SandboxError(f"machine {self.name} has no cgroup v2 group, so no freezer")
        try:
            (group / "cgroup.freeze").write_text("1" if frozen else "0")
        except OSError as exc:
            raise SandboxError(f"machine {self.name}: cannot {'freeze' if frozen else 'thaw'}: {exc}") from exc
        # cgroup.events says "frozen 1" once every task has stopped (a task in a syscall stops on its way out)
        if not _wait_events(group, "frozen", "1" if frozen else "0", time.monotonic() + deadline_s, strict=False):
            raise SandboxError(f"machine {self.name} did not {'freeze' if frozen else 'thaw'} in {deadline_s} s")

    @property
    def has_memory(self) -> bool:
        """Whether the machine has a memory group (one with a limit, or a parked launcher's)."""
        return "memory" in self._groups

    def memory_bytes(self) -> int:
        """The memory charged to the machine now: its processes' pages in RAM (v2 ``memory.current``, v1
        ``memory.usage_in_bytes``), not what it has in swap."""
        if "memory" not in self._groups:
            raise SandboxError(f"machine {self.name} has no memory group")
        version, group = self._groups["memory"]
        try:
            return int((group / ("memory.current" if version == 2 else "memory.usage_in_bytes")).read_text())
        except (OSError, ValueError) as exc:
            raise SandboxError(f"machine {self.name}: cannot read its memory use: {exc}") from exc

    def reclaim(self) -> None:
        """Push the machine's pages out of RAM as far as the kernel can: file pages dropped (clean ones) or
        written back, anonymous pages written to swap where the host has swap (else they stay). Meant for a
        frozen machine, whose processes touch nothing meanwhile: they fault the pages back in when thawed.

        v2: ``memory.reclaim`` with the whole usage asked (after lifting ``memory.swap.max``, which a memory limit
        sets to 0 so the limit binds RAM and swap together; see :meth:`swap_back`); v1: ``memory.force_empty``,
        which reclaims until nothing more goes (with the machine's processes still in it, it returns then)."""
        if "memory" not in self._groups:
            raise SandboxError(f"machine {self.name} has no memory group")
        version, group = self._groups["memory"]
        try:
            if version == 2:
                with contextlib.suppress(OSError):
                    (group / "memory.swap.max").write_text("max")
                try:
                    (group / "memory.reclaim").write_text(str(self.memory_bytes()))
                except OSError as exc:
                    if exc.errno != errno.EAGAIN:  # EAGAIN: less than asked could go, which is expected
                        raise
            else:
                (group / "memory.force_empty").write_text("0")
        except OSError as exc:
            raise SandboxError(f"machine {self.name}: cannot reclaim its memory: {exc}") from exc

    def swap_back(self) -> None:
        """After a thaw: a v2 group's ``memory.swap.max`` as its memory limit has it again (pages already in swap
        stay there until touched; the machine cannot put more there). Nothing to do on v1 (``memsw`` binds both)."""
        if "memory" not in self._groups or self._groups["memory"][0] != 2 or self.limits is None:
            return
        if self.limits.memory_bytes is not None:
            with contextlib.suppress(OSError):
                (self._groups["memory"][1] / "memory.swap.max").write_text("0")

    def cpu_usage_us(self) -> int:
        """CPU time every process of the machine has used so far, in microseconds (cgroup v2 ``cpu.stat``)."""
        group = self._v2_group()
        if group is None:
            raise SandboxError(f"machine {self.name} has no cgroup v2 group to read its CPU time from")
        for line in (group / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value)
        raise SandboxError(f"machine {self.name}: cpu.stat has no usage_usec")

    def kill(self, deadline_s: float = 120.0) -> None:
        """Kill every process in the groups and return once none is left in them (``SandboxError`` otherwise).

        ``cgroup.kill`` where the host has it; else the fallback: freeze, SIGKILL each process, thaw. The deadline
        is generous: a process killed in the middle of a fork waits for the kernel's locks on the files it maps,
        which another machine's fork bomb of the same interpreter holds often (seconds, on a loaded host).
        """
        group = self._v2_group()
        end = time.monotonic() + deadline_s
        self._hurry()
        killed = False
        if self.kill_file is not None:
            try:
                self.kill_file.write_text("1")
                killed = True
            except OSError:
                killed = False  # an old kernel after all: the fallback below
        if not killed:
            self._kill_each(group, end)
        if group is not None:
            _wait_events(group, "populated", "0", end)
        # the v1 groups (a hybrid host's controllers) hold the same processes; a v1-only host is emptied here
        while self.pids() - self._spared:
            if time.monotonic() > end:
                raise SandboxError(f"machine {self.name}: processes survived teardown: {sorted(self.pids())[:20]}")
            self._kill_pass()
            time.sleep(0.002)  # v1 has no event to wait on; bounded by the deadline

    def spare(self, pid: int) -> bool:
        """Move ``pid`` (a process of this one's, outside the sandbox) out of the machine's groups into this
        process's own, so that ``kill`` spares it; whether it left the v2 group (which ``cgroup.kill`` empties).

        bwrap, above the machine's pid namespace, is spared: it then outlives the namespace's first process and
        reaps it, where killed with the rest it could die first and leave that process a zombie of the machine
        for the host's init to reap, whenever that gets to it.
        """
        if self._v2_group() is None:
            return False
        self._spared.add(pid)
        moved = []
        for home in self._homes:
            try:
                (home / "cgroup.procs").write_text(str(pid))
                moved.append(home)
            except OSError:
                continue  # left in that group: kill passes over it all the same
        return bool(moved) and moved[0] == self._homes[0]

    def _hurry(self) -> None:
        """Give the machine's group the largest CPU weight: a process SIGKILLed must still be scheduled to exit,
        and under load (another machine's fork bomb) it waited seconds among everyone else's processes."""
        if "cpu" not in self._groups:
            return
        version, folder = self._groups["cpu"]
        with contextlib.suppress(OSError):
            if version == 2:
                (folder / "cpu.weight").write_text("10000")
            else:
                (folder / "cpu.shares").write_text("262144")

    def _kill_each(self, group: Path | None, end: float) -> None:
        """The fallback without ``cgroup.kill``: freeze the group so no process forks, SIGKILL each one (a frozen
        process still dies of it), until the group lists none, then thaw it."""
        frozen = False
        if group is not None:
            with contextlib.suppress(OSError):
                (group / "cgroup.freeze").write_text("1")
                frozen = True
                _wait_events(group, "frozen", "1", min(end, time.monotonic() + 5.0), strict=False)
        try:
            while self._kill_pass():
                if time.monotonic() > end:
                    return  # said by kill(), which checks what is left
                if group is not None:
                    _wait_events(group, "populated", "0", min(end, time.monotonic() + 0.05), strict=False)
        finally:
            if frozen and group is not None:
                with contextlib.suppress(OSError):
                    (group / "cgroup.freeze").write_text("0")

    def _kill_pass(self) -> bool:
        """SIGKILL every process the groups list now (but the spared); whether there was any."""
        left = self.pids() - self._spared
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return bool(left)

    def remove(self, deadline_s: float = 10.0) -> None:
        """Remove the (empty) groups; ``SandboxError`` naming those that could not be."""
        end = time.monotonic() + deadline_s
        left: list[str] = []
        for directory in reversed(self.dirs):
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    # EBUSY: a task that left cgroup.procs is still exiting; the v2 group says when it is gone
                    if exc.errno != errno.EBUSY or time.monotonic() > end:
                        left.append(f"{directory} ({exc.strerror})")
                        break
                    if (directory / "cgroup.events").exists():
                        _wait_events(directory, "populated", "0", end, strict=False)
                    time.sleep(0.002)  # v1 has no event to wait on; bounded by the deadline
        self.dirs = []
        if left:
            raise SandboxError(f"machine {self.name}: cgroups left behind: {', '.join(left)}")


def _wait_events(group: Path, key: str, value: str, end: float, *, strict: bool = True) -> bool:
    """Wait until the group's ``cgroup.events`` says ``key value``, by ``poll`` on the file (the kernel wakes it
    at every change), until the monotonic time ``end``; ``SandboxError`` past it when ``strict``."""
    try:
        fd = os.open(group / "cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True  # the group is gone: nothing is in it
    except OSError as exc:
        raise SandboxError(f"cannot read {group}/cgroup.events: {exc}") from exc
    try:
        poller = select.poll()
        poller.register(fd, select.POLLPRI | select.POLLERR)
        while True:
            # each read (from the start) re-arms the wake-up; a change after it makes the poll return at once
            text = os.pread(fd, 4096, 0).decode()
            if f"{key} {value}" in text.splitlines():
                return True
            left_s = end - time.monotonic()
            if left_s <= 0:
                if strict:
                    raise SandboxError(f"{group}: still not '{key} {value}' in cgroup.events")
                return False
            poller.poll(max(1, min(int(left_s * 1000), 1000)))
    except OSError as exc:
        if exc.errno == errno.ENODEV:
            return True  # removed while we waited
        raise SandboxError(f"cannot read {group}/cgroup.events: {exc}") from exc
    finally:
        os.close(fd)
