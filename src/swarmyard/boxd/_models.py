"""The records the ``Boxd`` client hands back, shaped like boxd's own: plain data, no methods that call out."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from swarmyard.machines.protocol import ExecResult as RawExecResult
from swarmyard.machines.protocol import MachineInfo, MachineState

#: A machine's status in boxd's words (``suspended`` is a paused machine).
MachineStatus = Literal["starting", "running", "suspended", "failed", "destroyed"]
#: Whether a machine's processes run or are suspended for being idle (see :mod:`swarmyard.machines.idle`).
Suspension = Literal["running", "frozen", "hibernated"]
_STATUS: dict[MachineState, MachineStatus] = {
    MachineState.BOOTING: "starting",
    MachineState.READY: "running",
    MachineState.FAILED: "failed",
    MachineState.DELETED: "destroyed",
}


@dataclass(frozen=True, slots=True)
class MachineSource:
    """Where a machine came from: a ``fork`` of another machine or a ``snapshot`` (with its version)."""

    kind: Literal["fork", "snapshot"]
    name: str
    version: int | None = None
    id: str | None = None


@dataclass(frozen=True, slots=True)
class Machine:
    """One machine as the client sees it."""

    id: str
    name: str
    status: MachineStatus
    created_at: datetime
    backend: str
    group: str | None = None
    source: MachineSource | None = None
    #: the isolation the host enforces for it (namespaces, seccomp, landlock, cgroups...), once it is running
    enforced: tuple[str, ...] = ()
    #: its address on each private network it is on (``<name>.yard`` resolves to it there), once it is running
    addresses: dict[str, str] = field(default_factory=dict)
    #: for a fork: whether its source's running processes and their memory came with it (``None``: not a fork)
    fork_memory: bool | None = None
    #: for a fork that kept the disk only: why
    fork_memory_reason: str | None = None
    #: ``frozen`` once idle for the client's ``idle_suspend_s`` (the next call wakes it), else ``running``
    suspension: Suspension = "running"
    #: when it was due to hibernate (its memory released after the client's ``hibernate_s``) and stays frozen
    #: instead: why (the host has no swap, say)
    hibernate_reason: str | None = None

    @classmethod
    def of(cls, info: MachineInfo, *, paused: bool = False, source: MachineSource | None = None) -> Machine:
        """The record of a backend's ``MachineInfo``."""
        status: MachineStatus = "suspended" if paused and info.state is MachineState.READY else _STATUS[info.state]
        if source is None and info.forked_from is not None:
            source = MachineSource("fork", info.forked_from, id=info.forked_from)
        return cls(info.id, info.name, status, datetime.fromtimestamp(info.created_at).astimezone(), info.backend,
                   info.group, source, info.enforced, dict(info.addresses), info.fork_memory,
                   info.fork_memory_reason, info.suspension.value, info.hibernate_reason)


@dataclass(frozen=True, slots=True)
class ExecResult:
    """A finished command: ``stdout``/``stderr`` decoded as UTF-8 (bad bytes replaced), the bytes as they came in
    ``stdout_raw``/``stderr_raw``."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    duration_s: float
    stdout_raw: bytes
    stderr_raw: bytes
    #: the host kept only a head and a tail of a stream that was longer (see ``machines.OutputCap``)
    truncated: bool = False

    @property
    def success(self) -> bool:
        """Whether the command exited 0 within its timeout."""
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def of(cls, raw: RawExecResult) -> ExecResult:
        """The record of a backend's result."""
        return cls(raw.stdout.decode("utf-8", "replace"), raw.stderr.decode("utf-8", "replace"), raw.exit_code,
                   raw.timed_out, raw.duration_s, raw.stdout, raw.stderr, raw.truncated)


@dataclass(frozen=True, slots=True)
class PauseResult:
    """A pause: how long freezing the machine's processes took."""

    suspend_us: int


@dataclass(frozen=True, slots=True)
class ResumeResult:
    """A resume: how long thawing them took."""

    resume_us: int
