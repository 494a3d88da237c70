"""The machines of one run: at most ``workers.max_machines`` live at once, each made for one agent run and
deleted when it ends (``per_task``), or kept by its worker slot for the next run (``per_slot``).

An agent run takes a machine before it starts and gives it back when it ends. Past the cap a take waits, and what
it waits for always comes: every live machine is running an agent (which ends by its exec timeout), being made or
deleted, or (``per_slot``) idle, and then the one idle longest is deleted to make room. A take that finds none of
these to wait for is an error (:class:`~swarmyard.errors.SandboxError`), never a wait without end.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass

from swarmyard.config import MachineLifetime
from swarmyard.errors import SandboxError


@dataclass(slots=True)
class HeldMachine:
    """A live machine of the run: its id, the slot holding it, the relay's URL and the home as the agent sees it."""

    id: str
    slot: str
    relay: str
    home: str
    busy: bool = True
    #: when it was last given back (a count, not a time): the lowest is the one idle longest
    idle_since: int = 0


class RunMachines:
    """Hands out the run's machines under the cap; ``make`` boots one for a slot, ``drop`` deletes one (both block,
    and run in the calling thread, outside the lock; ``drop`` must not raise)."""

    def __init__(self, cap: int, lifetime: MachineLifetime, make: Callable[[str], HeldMachine],
                 drop: Callable[[HeldMachine], None]) -> None:
        if cap < 1:
            raise SandboxError("a run needs room for at least one machine (workers.max_machines)")
        self.cap = cap
        self.lifetime = lifetime
        self._make = make
        self._drop = drop
        self._cond = threading.Condition()
        self._kept: dict[str, HeldMachine] = {}  # slot -> its live machine, busy or (per_slot) idle
        self._live = 0  # machines counted against the cap: kept, being made, being deleted
        self._changing = 0  # of those, being made or deleted right now
        self._ticks = itertools.count(1)
        self._closed = False
        self._waiting = 0
        #: the most machines that were live at once (for the report and the benchmark)
        self.peak = 0

    @property
    def live(self) -> int:
        """Machines counted against the cap now."""
        with self._cond:
            return self._live

    @property
    def waiting(self) -> int:
        """Agent runs waiting for a place under the cap now."""
        with self._cond:
            return self._waiting

    def take(self, slot: str) -> HeldMachine:
        """The slot's machine: its kept one (``per_slot``), else a new one once the cap has room."""
        victim: HeldMachine | None = None
        with self._cond:
            while True:
                if self._closed:
                    raise SandboxError("the run's machines are being deleted: no agent starts now")
                held = self._kept.get(slot)
                if held is not None:
                    if held.busy:  # the coordinator runs one agent per slot at a time
                        raise SandboxError(f"slot {slot} already runs an agent in machine {held.id}",
                                           machine_id=held.id)
                    held.busy = True
                    return held
                if self._live < self.cap:
                    self._live += 1
                    self.peak = max(self.peak, self._live)
                    break
                idle = [m for m in self._kept.values() if not m.busy]
                if idle:
                    # its place in the cap passes to this slot: deleted below, outside the lock
                    victim = min(idle, key=lambda m: m.idle_since)
                    del self._kept[victim.slot]
                    break
                if self._changing == 0 and not self._kept:
                    raise SandboxError(f"no machine can be had: all {self.cap} places of workers.max_machines are "
                                       "held, and none by a machine of this run that will end")
                self._waiting += 1
                try:
                    self._cond.wait()
                finally:
                    self._waiting -= 1
            self._changing += 1
        try:
            if victim is not None:
                self._drop(victim)
            held = self._make(slot)
        except BaseException:
            with self._cond:
                self._live -= 1
                self._changing -= 1
                self._cond.notify_all()
            raise
        with self._cond:
            closed = self._closed
            if not closed:
                self._changing -= 1
                self._kept[slot] = held
        if closed:  # the run is closing and did not see this one: it goes now
            self._end(held)
            raise SandboxError("the run's machines are being deleted: no agent starts now", machine_id=held.id)
        return held

    def give_back(self, held: HeldMachine, *, lost: bool = False) -> None:
        """An agent run ended: ``per_task`` deletes its machine, ``per_slot`` keeps it for the slot's next run
        (unless it is ``lost``: it went away under its agent, and is deleted whatever the lifetime)."""
        with self._cond:
            if self._kept.get(held.slot) is not held:
                return  # ``close`` took it
            if self.lifetime is MachineLifetime.PER_SLOT and not lost:
                held.busy = False
                held.idle_since = next(self._ticks)
                self._cond.notify_all()
                return
            del self._kept[held.slot]
            self._changing += 1
        self._end(held)

    def _end(self, held: HeldMachine) -> None:
        try:
            self._drop(held)
        finally:
            with self._cond:
                self._live -= 1
                self._changing -= 1
                self._cond.notify_all()

    def close(self) -> list[HeldMachine]:
        """Stop handing out machines; the machines still live (running or idle), for the caller to delete."""
        with self._cond:
            self._closed = True
            left = list(self._kept.values())
            self._kept.clear()
            self._live -= len(left)
            self._cond.notify_all()
        return left
