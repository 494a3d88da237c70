"""The run's machine cap: takes past it wait for a machine to end and then proceed; ``per_task`` deletes a
machine when its run ends, ``per_slot`` keeps it and deletes the one idle longest when room is needed.

``make`` and ``drop`` are small fakes that count; the waiting is real (threads), ordered by events, never by
sleeping.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from swarmyard.config import MachineLifetime
from swarmyard.errors import SandboxError
from swarmyard.swarm.run_machines import HeldMachine, RunMachines


class Fleet:
    """Machines as records: which exist now, the most that ever existed at once, every one made and dropped."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.alive: set[str] = set()
        self.peak = 0
        self.made: list[str] = []
        self.dropped: list[str] = []

    def make(self, slot: str) -> HeldMachine:
        with self.lock:
            machine = f"m{len(self.made)}"
            self.made.append(machine)
            self.alive.add(machine)
            self.peak = max(self.peak, len(self.alive))
        return HeldMachine(machine, slot, "http://127.0.0.1:1", "/machine")

    def drop(self, held: HeldMachine) -> None:
        with self.lock:
            self.alive.remove(held.id)
            self.dropped.append(held.id)


def test_per_task_makes_a_fresh_machine_for_every_run_and_deletes_it_at_the_end() -> None:
    fleet = Fleet()
    machines = RunMachines(2, MachineLifetime.PER_TASK, fleet.make, fleet.drop)
    first = machines.take("worker-0")
    machines.give_back(first)
    second = machines.take("worker-0")
    assert first.id != second.id and fleet.dropped == [first.id]
    machines.give_back(second)
    assert fleet.alive == set() and machines.live == 0


def test_more_runs_than_the_cap_queue_and_all_proceed() -> None:
    fleet = Fleet()
    machines = RunMachines(3, MachineLifetime.PER_TASK, fleet.make, fleet.drop)
    done: list[str] = []

    def run(i: int) -> None:
        held = machines.take(f"worker-{i}")
        done.append(held.id)
        machines.give_back(held)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(run, range(200)))
    assert len(done) == 200 and len(set(done)) == 200
    assert fleet.peak <= 3 and machines.peak <= 3 and fleet.alive == set()


def test_a_take_at_the_cap_waits_until_a_run_ends() -> None:
    fleet = Fleet()
    machines = RunMachines(1, MachineLifetime.PER_TASK, fleet.make, fleet.drop)
    held = machines.take("worker-0")
    got: list[HeldMachine] = []
    waiter = threading.Thread(target=lambda: got.append(machines.take("worker-1")))
    waiter.start()
    while machines.waiting == 0:  # until it waits for a place (it would end at once if it took one)
        waiter.join(timeout=0.01)
        assert waiter.is_alive() and got == []
    assert got == [] and fleet.made == [held.id]
    machines.give_back(held)
    waiter.join()
    assert [g.slot for g in got] == ["worker-1"] and fleet.alive == {got[0].id}


def test_per_slot_keeps_the_slot_machine_and_frees_the_longest_idle_at_the_cap() -> None:
    fleet = Fleet()
    machines = RunMachines(2, MachineLifetime.PER_SLOT, fleet.make, fleet.drop)
    a = machines.take("worker-0")
    machines.give_back(a)
    assert machines.take("worker-0") is a  # the same machine, disk and all
    machines.give_back(a)
    b = machines.take("worker-1")
    machines.give_back(b)
    c = machines.take("worker-2")  # the cap is full of idle machines: worker-0's went first, idle longest
    assert fleet.dropped == [a.id] and fleet.alive == {b.id, c.id}
    machines.give_back(c)
    assert machines.take("worker-0").id not in (a.id, b.id, c.id)  # made again, fresh
    assert fleet.dropped == [a.id, b.id]


def test_close_hands_back_every_live_machine_and_refuses_new_runs() -> None:
    fleet = Fleet()
    machines = RunMachines(4, MachineLifetime.PER_SLOT, fleet.make, fleet.drop)
    running = machines.take("worker-0")
    idle = machines.take("worker-1")
    machines.give_back(idle)
    left = machines.close()
    assert {m.id for m in left} == {running.id, idle.id}
    machines.give_back(running)  # the run ends after close: close's caller deletes it, not give_back
    assert fleet.dropped == []
    with pytest.raises(SandboxError):
        machines.take("worker-2")


def test_a_machine_that_fails_to_boot_gives_its_place_back() -> None:
    fleet = Fleet()
    calls = {"n": 0}

    def make(slot: str) -> HeldMachine:
        calls["n"] += 1
        if calls["n"] == 1:
            raise SandboxError("boot failed")
        return fleet.make(slot)

    machines = RunMachines(1, MachineLifetime.PER_TASK, make, fleet.drop)
    with pytest.raises(SandboxError):
        machines.take("worker-0")
    assert machines.live == 0
    held = machines.take("worker-0")  # the place was given back: no wait
    assert held.id == "m0"


def test_a_cap_below_one_is_refused() -> None:
    fleet = Fleet()
    with pytest.raises(SandboxError):
        RunMachines(0, MachineLifetime.PER_TASK, fleet.make, fleet.drop)
