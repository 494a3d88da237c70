"""How the coordinator runs one agent for one worker slot; backends behind one Protocol."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from swarmyard.agents.settings import Role
from swarmyard.domain import Goal
from swarmyard.report.data import WorkerSpan


@dataclass(frozen=True, slots=True)
class WorkerSlot:
    """A worker place: its name, its group (board) and its role; the lead slot names the task it must take."""

    name: str
    group: str
    role: Role = Role.WORKER
    task_id: str | None = None


class WorkerLauncher(Protocol):
    """Starts agents in machines. ``close`` deletes every machine it made, on success, error and Ctrl-C."""

    async def start(self, goal: Goal) -> None:
        """Get ready to run workers for ``goal`` (control plane up, machines backend open)."""
        ...

    async def run(self, slot: WorkerSlot) -> WorkerSpan:
        """Run one agent for ``slot`` to its end (or its exec timeout); return what it did."""
        ...

    def claim_floor(self, role: Role) -> int:
        """The least model call an agent of ``role`` makes, in micro-USD, as the plane prices it when the agent
        claims: a task whose envelope cannot afford it is refused at claim (0: no floor)."""
        ...

    def worker_of(self, slot: str) -> str | None:
        """The worker id of the agent running in ``slot`` now (for the live table), or ``None``."""
        ...

    async def close(self) -> None:
        """Delete every machine and stop everything ``start`` started."""
        ...
