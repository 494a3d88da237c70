"""Pausing a machine with the cgroup v2 freezer: its processes stop being scheduled, keep their memory, and go on
from where they stopped when it is resumed. A paused machine uses no CPU (its group's ``cpu.stat`` stands still).

A paused machine's init is frozen with the rest, so nothing can be run in it until it is resumed: callers keep
track and refuse (the Boxd client answers such a call with a ``ConflictError``).
"""

from __future__ import annotations

import time

from swarmyard.errors import SandboxError, SandboxUnavailableError
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


def pause(backend: Backend, machine_id: str) -> int:
    """Freeze every process of the machine; returns how long that took, in microseconds."""
    started = time.perf_counter_ns()
    _cgroups(backend, machine_id).freeze(True)
    return (time.perf_counter_ns() - started) // 1000


def resume(backend: Backend, machine_id: str) -> int:
    """Thaw the machine's processes; returns how long that took, in microseconds."""
    started = time.perf_counter_ns()
    _cgroups(backend, machine_id).freeze(False)
    return (time.perf_counter_ns() - started) // 1000


def cpu_usage_us(backend: Backend, machine_id: str) -> int:
    """The CPU time the machine's processes have used, in microseconds."""
    return _cgroups(backend, machine_id).cpu_usage_us()
