"""Pausing a machine with the cgroup v2 freezer: its processes stop being scheduled, keep their memory, and go on
from where they stopped when it is resumed. A paused machine uses no CPU (its group's ``cpu.stat`` stands still).

A paused machine's init is frozen with the rest, so nothing can be run in it until it is resumed: callers keep
track and refuse (the Boxd client answers such a call with a ``ConflictError``).
"""

from __future__ import annotations

import time
from pathlib import Path

from swarmyard.errors import SandboxError, SandboxUnavailableError
from swarmyard.machines import live
from swarmyard.machines.cgroups import MachineCgroups
from swarmyard.machines.protocol import Backend, MachineState


def _cgroups(backend: Backend, machine_id: str) -> MachineCgroups:
    from swarmyard.machines.supervised import SupervisedBackend

    if not isinstance(backend, SupervisedBackend):
        raise SandboxUnavailableError(f"the {backend.name} backend cannot pause machines")
    machine = backend._get(machine_id)
    if machine.info.state is not MachineState.READY:
        raise SandboxError(f"machine {machine_id} is {machine.info.state}, not ready", machine_id=machine_id)
    if machine.cgroups is None or not machine.cgroups.can_freeze:
        raise SandboxUnavailableError("this host gives machines no cgroup v2 group, so no freezer: pausing needs "
                                      "cgroup v2 (see swarmyard machines doctor)", machine_id=machine_id)
    return machine.cgroups


def _marker(backend: Backend, machine_id: str) -> Path:
    """The mark of a paused machine in its folder, which another process copying its disk heeds (see live)."""
    from swarmyard.machines.supervised import SupervisedBackend

    assert isinstance(backend, SupervisedBackend)  # checked by _cgroups
    return backend._get(machine_id).root / live.PAUSED


def pause(backend: Backend, machine_id: str) -> int:
    """Freeze every process of the machine; returns how long that took, in microseconds.

    Marked first: a ``snapshot create --from`` of another process that froze the machine before would otherwise
    thaw it when its copy ends, and the paused machine would run."""
    started = time.perf_counter_ns()
    group = _cgroups(backend, machine_id)
    _marker(backend, machine_id).touch()
    group.freeze(True)
    return (time.perf_counter_ns() - started) // 1000


def resume(backend: Backend, machine_id: str) -> int:
    """Thaw the machine's processes; returns how long that took, in microseconds."""
    started = time.perf_counter_ns()
    group = _cgroups(backend, machine_id)
    _marker(backend, machine_id).unlink(missing_ok=True)
    group.freeze(False)
    return (time.perf_counter_ns() - started) // 1000


def cpu_usage_us(backend: Backend, machine_id: str) -> int:
    """The CPU time the machine's processes have used, in microseconds."""
    return _cgroups(backend, machine_id).cpu_usage_us()
