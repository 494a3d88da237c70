"""Pause and resume through the Boxd client, in a real ``local`` machine: a paused machine's processes use no CPU
(its cgroup's ``cpu.stat`` stands still while the host works on) and resume as the same processes, memory intact.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.boxd import Boxd
from swarmyard.broker.providers.scripted import ScriptedProvider
from swarmyard.errors import ConflictError

pytestmark = [pytest.mark.bwrap]


@pytest.fixture
def boxd(short_tmp: Path) -> Iterator[Boxd]:
    folder = short_tmp
    (folder / "providers.toml").write_text('[providers.script]\nkind = "scripted"\nmodels = ["m"]\n')
    client = Boxd(providers=folder / "providers.toml", provider_objects={"script": ScriptedProvider({})}, model="m")
    yield client
    client.close()


def _burn_host_cpu(seconds: float) -> None:
    """Let time pass by doing work here, measured in this process's own CPU time (not a sleep)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_paused_machine_uses_no_cpu_and_resumes_the_same_process(boxd: Boxd) -> None:
    machine = boxd.machines.create("spinner")
    boxd.machines.wait_until_ready(machine.id)
    # a shell that counts in its own memory and writes the count out only when asked (SIGUSR1)
    start = boxd.machines.exec(machine.id, "(n=0; trap 'echo $n > /home/boxd/count' USR1; "
                                           "while :; do n=$((n+1)); done) >/dev/null 2>&1 & echo $!")
    pid = start.stdout.strip()
    assert start.success and pid.isdigit()
    before = boxd.machines.cpu_time_us(machine.id)
    deadline = time.monotonic() + 30
    while boxd.machines.cpu_time_us(machine.id) < before + 200_000:  # it is spinning: 0.2 s of CPU, bounded
        assert time.monotonic() < deadline, "the spinner never used CPU"
        _burn_host_cpu(0.01)
    paused = boxd.machines.pause(machine.id)
    assert paused.suspend_us > 0 and boxd.machines.get(machine.id).status == "suspended"
    frozen_at = boxd.machines.cpu_time_us(machine.id)
    _burn_host_cpu(0.5)  # half a second of this process's CPU: a running spinner would have had its share
    assert boxd.machines.cpu_time_us(machine.id) == frozen_at
    with pytest.raises(ConflictError, match="paused"):
        boxd.machines.exec(machine.id, "true")
    resumed = boxd.machines.resume(machine.id)
    assert resumed.resume_us > 0 and boxd.machines.get(machine.id).status == "running"
    counts = []
    for _ in range(2):
        done = boxd.machines.exec(machine.id, f"kill -USR1 {pid} && while [ ! -s count ]; do :; done; "
                                              "cat count; rm count")
        assert done.success, done.stderr
        counts.append(int(done.stdout))
    assert 0 < counts[0] < counts[1]  # the same process, its count kept across the pause and still going
    assert boxd.machines.cpu_time_us(machine.id) > frozen_at
    with pytest.raises(ConflictError, match="not paused"):
        boxd.machines.resume(machine.id)


def test_a_paused_machine_can_be_deleted(boxd: Boxd) -> None:
    machine = boxd.machines.create("frozen")
    boxd.machines.wait_until_ready(machine.id)
    boxd.machines.pause("frozen")
    boxd.machines.delete("frozen")
    assert boxd.machines.list() == []
