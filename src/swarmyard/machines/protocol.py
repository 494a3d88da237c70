"""The Machines API's data types and the Protocol every backend implements (local, process, ray)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol


class MachineState(StrEnum):
    """Where a machine is in its life."""

    BOOTING = "booting"
    READY = "ready"
    FAILED = "failed"
    DELETED = "deleted"


class Suspension(StrEnum):
    """Whether a ready machine's processes run, or were suspended for being idle (see
    :mod:`swarmyard.machines.idle`); a call or a packet wakes it."""

    RUNNING = "running"
    #: cgroup freezer: its processes keep their memory and use no CPU
    FROZEN = "frozen"
    #: its memory written to disk and its processes ended, restored on wake (not built yet)
    HIBERNATED = "hibernated"


#: Allowed state changes; anything else is a bug in a backend.
TRANSITIONS: dict[MachineState, frozenset[MachineState]] = {
    MachineState.BOOTING: frozenset({MachineState.READY, MachineState.FAILED, MachineState.DELETED}),
    MachineState.READY: frozenset({MachineState.FAILED, MachineState.DELETED}),
    MachineState.FAILED: frozenset({MachineState.DELETED}),
    MachineState.DELETED: frozenset(),
}


#: How long a machine may take to boot before it is an error: a quiet host boots one in milliseconds, but a
#: burst of hundreds on a busy 2-core host took 20-50 s (a boot that waits is not a boot that failed).
BOOT_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits of one machine; ``None`` means no limit of that kind."""

    memory_bytes: int | None = 1 << 30
    pids: int | None = 512
    cpus: float | None = None
    #: The machine's writable disk, enforced by the kernel (a full disk is ``ENOSPC`` inside the machine).
    disk_bytes: int | None = 1 << 30


@dataclass(frozen=True, slots=True)
class OutputCap:
    """How much of each stream of an exec the host keeps: the first ``head_bytes`` and the last ``tail_bytes``.

    A command can write far more than the host should hold (a worker printing gigabytes); what falls between the
    two is counted and dropped as it arrives, so memory stays bounded whatever the command writes.
    """

    head_bytes: int = 2 << 20
    tail_bytes: int = 2 << 20


@dataclass(frozen=True, slots=True)
class Isolation:
    """What a sandbox must have; a backend refuses to start one weaker unless ``allow_weaker`` is set."""

    namespaces: bool = True
    seccomp: bool = True
    landlock: bool = True
    cgroups: bool = True
    allow_weaker: bool = False
    #: when not empty, the only files a process in the machine may execute (Landlock's execute right; the ELF
    #: interpreter each needs is added): a governed machine gets its agent's interpreter alone, so ``exec`` of a
    #: shell or any other program fails at the sandbox. Never weakened: a host without Landlock refuses it.
    exec_only: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ExecResult:
    """The outcome of one command run in a machine; ``exit_code`` is ``128 + signal`` for a killed command.

    ``stdout`` and ``stderr`` hold at most a head and a tail of each stream (see :class:`OutputCap`); when either
    lost its middle, ``truncated`` is set and ``stdout_bytes``/``stderr_bytes`` say how much the command wrote.
    """

    stdout: bytes
    stderr: bytes
    exit_code: int
    timed_out: bool
    duration_s: float
    truncated: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0

    @property
    def ok(self) -> bool:
        """Whether the command exited 0 within its timeout."""
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True, slots=True)
class ExecEvent:
    """One piece of a streamed exec: ``stdout``/``stderr`` data, then one ``exit`` carrying the result."""

    kind: str
    data: bytes = b""
    result: ExecResult | None = None


@dataclass(frozen=True, slots=True)
class MachineSpec:
    """Everything a backend needs to make a machine; built and validated by :class:`~swarmyard.machines.Machines`."""

    id: str
    name: str
    env: Mapping[str, str]
    limits: Limits
    isolation: Isolation
    group: str | None = None
    baseline: str | None = None
    control_socket: Path | None = None
    #: private networks the machine joins (see :mod:`swarmyard.machines.networks`); none: isolated
    networks: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MachineInfo:
    """What a caller may know about a machine."""

    id: str
    name: str
    backend: str
    state: MachineState
    created_at: float
    group: str | None = None
    baseline: str | None = None
    forked_from: str | None = None
    relay_port: int | None = None
    disk: str | None = None
    enforced: tuple[str, ...] = field(default_factory=tuple)
    #: where the machine runs, for backends that place machines on several hosts (the Ray node id)
    node: str | None = None
    #: (network, address) for each private network the machine is on
    addresses: tuple[tuple[str, str], ...] = ()
    #: for a fork: whether it carries its source's running processes and their memory (``None``: not a fork)
    fork_memory: bool | None = None
    #: for a fork that kept the disk only: why (see :mod:`swarmyard.machines.checkpoint`)
    fork_memory_reason: str | None = None
    #: whether its processes run or are suspended for being idle (see :mod:`swarmyard.machines.idle`)
    suspension: Suspension = Suspension.RUNNING
    #: for a machine due to hibernate that stays frozen instead: why its memory could not be released
    hibernate_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Baseline:
    """A prepared, read-only disk that machines start from without copying it."""

    name: str
    path: Path


class Backend(Protocol):
    """One way to run machines. Every call takes the machine id the backend returned from ``create``."""

    name: str

    def create(self, spec: MachineSpec) -> MachineInfo:
        """Start booting a machine and return at once."""
        ...

    def fork(self, source_id: str, spec: MachineSpec) -> MachineInfo:
        """Start a machine whose disk begins as a copy-on-write snapshot of ``source_id``'s."""
        ...

    def wait_until_ready(self, machine_id: str, timeout_s: float) -> MachineInfo:
        """Block until the machine can run commands."""
        ...

    def exec(
        self,
        machine_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        timeout_s: float | None,
        stdin: bytes | None,
    ) -> ExecResult:
        """Run a command to completion."""
        ...

    def stream_exec(
        self,
        machine_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        timeout_s: float | None,
        stdin: bytes | None,
    ) -> Iterator[ExecEvent]:
        """Run a command, yielding output as it comes and the result last."""
        ...

    def upload(self, machine_id: str, path: str, data: bytes, mode: int) -> None:
        """Write a file inside the machine (as the machine, so its own limits apply)."""
        ...

    def download(self, machine_id: str, path: str) -> bytes:
        """Read a file from inside the machine."""
        ...

    def delete(self, machine_id: str) -> None:
        """Kill every process of the machine and remove its disk and mounts."""
        ...

    def list(self) -> list[MachineInfo]:
        """Machines this backend runs."""
        ...

    def prepare_baseline(self, name: str, source: Path) -> Baseline:
        """Freeze a folder as a baseline that later machines see without copying."""
        ...

    def sandbox_prefix(self) -> str:
        """The machine's home folder as its commands see it."""
        ...

    def close(self) -> None:
        """Delete every machine and release the backend's resources."""
        ...
