"""Suspend on idle with an injected clock: real bubblewrap machines, real cgroup v2 freezer, no sleeping.

A machine is frozen once the clock says it went ``idle_suspend_s`` without a call or a packet, never while a call is
in flight or packets move in it, and the next call wakes it where it stopped. The kernel's own word on the freezer
is read from the machine's cgroup (``cgroup.events``), found from its processes' ``/proc/PID/cgroup``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.clock import FakeClock
from swarmyard.errors import InvalidInputError
from swarmyard.machines import Machines
from swarmyard.machines.cgroups import discover
from swarmyard.machines.idle import Suspender, host_swap_reason
from swarmyard.machines.protocol import MachineState, Suspension

pytestmark = pytest.mark.bwrap

_COUNTER = "i=0; while :; do i=$((i+1)); echo $i > count; sleep 0.01; done"


def _needs_freezer() -> None:
    if discover().v2 is None:
        pytest.skip("this host has no writable cgroup v2 hierarchy, so no freezer")


@pytest.fixture
def machines(tmp_path: Path, clock: FakeClock) -> Iterator[Machines]:
    _needs_freezer()
    api = Machines("local", root=tmp_path / "root", idle_suspend_s=60.0, clock=clock)
    # the test sweeps after moving its clock, and no thread sweeps between: each step is the test's
    api.idle = Suspender(api.backend, 60.0, clock=clock, sweeping=False)
    yield api
    api.close()


def _kernel_frozen(machines: Machines, machine_id: str) -> bool:
    """What the kernel says of the machine's v2 group: ``frozen 1`` in its ``cgroup.events``."""
    view = machines.host_view(machine_id)
    assert view is not None
    mount = next(ln.split()[1] for ln in Path("/proc/self/mounts").read_text().splitlines()
                 if ln.split()[2] == "cgroup2")
    line = next(ln for ln in Path(f"/proc/{view.pids[0]}/cgroup").read_text().splitlines() if ln.startswith("0::"))
    group = Path(mount) / line[3:].lstrip("/")
    return "frozen 1" in (group / "cgroup.events").read_text().splitlines()


def _suspension(machines: Machines, machine_id: str) -> Suspension:
    return next(i.suspension for i in machines.list() if i.id == machine_id)


def _count(machines: Machines, machine_id: str) -> int:
    return int(machines.exec(machine_id, "cat count").stdout or b"0")


def _until(check: object, what: str, limit_s: float = 60.0) -> None:
    """Poll ``check`` until it holds: bounded by its progress, the limit only guards against a hang."""
    end = time.monotonic() + limit_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < end, f"never: {what}"


def test_an_idle_machine_is_frozen_and_the_next_exec_wakes_it_where_it_stopped(machines: Machines,
                                                                               clock: FakeClock) -> None:
    info = machines.create("idle")
    pid = machines.exec(info.id, f"({_COUNTER}) </dev/null >/dev/null 2>&1 & echo $!").stdout.decode().strip()
    _until(lambda: _count(machines, info.id) > 0, "the counter counts")
    clock.advance(59.0)
    machines.idle.sweep()
    assert _suspension(machines, info.id) is Suspension.RUNNING  # not idle long enough
    clock.advance(2.0)
    machines.idle.sweep()
    assert _suspension(machines, info.id) is Suspension.FROZEN
    assert _kernel_frozen(machines, info.id)
    assert machines.list()[0].state is MachineState.READY

    woken = machines.exec(info.id, f"kill -0 {pid} && cat count")  # the same process, alive
    assert woken.exit_code == 0, woken.stderr
    assert _suspension(machines, info.id) is Suspension.RUNNING
    assert not _kernel_frozen(machines, info.id)
    at_wake = int(woken.stdout)
    _until(lambda: _count(machines, info.id) > at_wake, "the counter goes on from where it stopped")


def test_a_call_in_flight_keeps_a_machine_awake_and_its_end_restarts_the_idle_time(machines: Machines,
                                                                                   clock: FakeClock) -> None:
    info = machines.create("busy")
    machines.wait_until_ready(info.id)
    done: list[int] = []
    waiter = threading.Thread(target=lambda: done.append(
        machines.exec(info.id, "while [ ! -e go ]; do sleep 0.01; done").exit_code))
    waiter.start()
    _until(lambda: "sleep" in machines.exec(info.id, "ps -eo args").stdout.decode(), "the exec runs")
    clock.advance(600.0)
    machines.idle.sweep()
    assert _suspension(machines, info.id) is Suspension.RUNNING  # an exec in flight: never frozen
    machines.files.upload(info.id, "go", b"")
    waiter.join(60)
    assert done == [0]
    clock.advance(59.0)
    machines.idle.sweep()
    assert _suspension(machines, info.id) is Suspension.RUNNING  # its end started the idle time again
    clock.advance(2.0)
    machines.idle.sweep()
    assert _suspension(machines, info.id) is Suspension.FROZEN
    assert machines.files.download(info.id, "go") == b""  # a file call wakes it too
    assert _suspension(machines, info.id) is Suspension.RUNNING


def _packets(machines: Machines, machine_id: str) -> int:
    view = machines.host_view(machine_id)
    assert view is not None
    total = 0
    for line in Path(f"/proc/{view.pids[0]}/net/dev").read_text().splitlines()[2:]:
        fields = line.partition(":")[2].split()
        total += int(fields[1]) + int(fields[9])
    return total


def test_network_traffic_in_a_machine_keeps_it_awake(machines: Machines, clock: FakeClock) -> None:
    info = machines.create("talker")
    sender = ("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
              "while True: s.sendto(b'x', ('127.0.0.1', 9))\n")
    pid = machines.exec(info.id, ["sh", "-c", 'python3 -c "$0" </dev/null >/dev/null 2>&1 & echo $!',
                                  sender]).stdout.decode().strip()
    machines.idle.sweep()  # the counters as this sweep saw them
    seen = _packets(machines, info.id)
    _until(lambda: _packets(machines, info.id) > seen, "packets move after the sweep")
    clock.advance(120.0)
    machines.idle.sweep()  # idle by calls, not by packets
    assert _suspension(machines, info.id) is Suspension.RUNNING
    assert machines.exec(info.id, f"kill {pid}").exit_code == 0
    clock.advance(61.0)
    machines.idle.sweep()  # whatever it sent before it died counts once more
    clock.advance(61.0)
    machines.idle.sweep()
    assert _suspension(machines, info.id) is Suspension.FROZEN


def test_a_paused_machine_is_left_to_its_owner_and_delete_of_a_frozen_machine_works(machines: Machines,
                                                                                    clock: FakeClock) -> None:
    from swarmyard.machines import pausing

    paused = machines.create("paused")
    frozen = machines.create("frozen")
    for info in (paused, frozen):
        machines.wait_until_ready(info.id)
    pausing.pause(machines.backend, paused.id)
    clock.advance(61.0)
    machines.idle.sweep()
    # the paused one is its owner's to resume
    assert [_suspension(machines, i.id) for i in (paused, frozen)] == [Suspension.RUNNING, Suspension.FROZEN]
    pausing.resume(machines.backend, paused.id)
    machines.delete(frozen.id)
    assert [i.id for i in machines.list()] == [paused.id]


def test_idle_suspend_s_must_be_a_positive_number_or_none(tmp_path: Path) -> None:
    for bad in (0, -1, "60", True, float("nan")):
        with pytest.raises(InvalidInputError) as caught:
            Machines("local", root=tmp_path / "r", idle_suspend_s=bad)  # type: ignore[arg-type]
        assert caught.value.field == "idle_suspend_s"
    assert not (tmp_path / "r").exists()  # refused before a backend was made


def test_a_packet_on_a_private_network_wakes_a_frozen_machine(machines: Machines, clock: FakeClock) -> None:
    from swarmyard.machines import networks

    if (why := networks.available()) is not None:
        pytest.skip(why)
    quiet = machines.create("quiet", networks=["pond"])
    caller = machines.create("caller", networks=["pond"])
    for info in (quiet, caller):
        machines.wait_until_ready(info.id)
    clock.advance(61.0)
    machines.idle.sweep()
    assert {_suspension(machines, i.id) for i in (quiet, caller)} == {Suspension.FROZEN}
    before = _packets(machines, quiet.id)
    sent = machines.exec(caller.id, ["python3", "-c", "import socket; socket.socket(socket.AF_INET, "
                                     "socket.SOCK_DGRAM).sendto(b'knock', ('quiet.yard', 9))"])
    assert sent.exit_code == 0, sent.stderr
    assert _suspension(machines, quiet.id) is Suspension.FROZEN  # the caller's exec woke the caller only
    _until(lambda: _packets(machines, quiet.id) > before, "the packet reaches the frozen machine")
    machines.idle.sweep()
    assert _suspension(machines, quiet.id) is Suspension.RUNNING
    assert not _kernel_frozen(machines, quiet.id)


def test_a_streamed_exec_keeps_its_machine_awake_while_it_is_read(machines: Machines, clock: FakeClock) -> None:
    info = machines.create("stream")
    machines.wait_until_ready(info.id)
    unread = machines.stream_exec(info.id, "echo never read")  # a stream never read holds nothing
    events = machines.stream_exec(info.id, "echo first; while [ ! -e go ]; do sleep 0.01; done; echo last")
    assert next(events).data == b"first\n"
    clock.advance(600.0)
    machines.idle.sweep()
    assert _suspension(machines, info.id) is Suspension.RUNNING  # being read: never frozen
    machines.files.upload(info.id, "go", b"")
    assert [e.kind for e in events][-1] == "exit"
    clock.advance(61.0)
    machines.idle.sweep()
    assert _suspension(machines, info.id) is Suspension.FROZEN
    del unread


def test_hibernate_s_is_checked_and_not_less_than_idle_suspend_s(tmp_path: Path) -> None:
    for bad in (0, -1.0, True, "600"):
        with pytest.raises(InvalidInputError) as caught:
            Machines("local", root=tmp_path / "a", hibernate_s=bad)  # type: ignore[arg-type]
        assert caught.value.details.get("field") == "hibernate_s"
    api = Machines("local", root=tmp_path / "b", idle_suspend_s=60.0, hibernate_s=None)
    assert api.idle.hibernate_s is None
    api.close()
    with pytest.raises(InvalidInputError):
        Suspender(api.backend, 60.0, hibernate_s=30.0, sweeping=False)
    # the default follows an idle_suspend_s longer than it
    assert Suspender(api.backend, 3600.0, sweeping=False).hibernate_s == 3600.0


def test_a_machine_due_to_hibernate_is_hibernated_or_stays_frozen_and_says_why(machines: Machines,
                                                                                clock: FakeClock) -> None:
    machines.idle = Suspender(machines.backend, 60.0, clock=clock, sweeping=False, hibernate_s=600.0)
    info = machines.create("sleeper")
    pid = machines.exec(info.id, f"({_COUNTER}) </dev/null >/dev/null 2>&1 & echo $!").stdout.decode().strip()
    _until(lambda: _count(machines, info.id) > 0, "the counter counts")
    clock.advance(61.0)
    machines.idle.sweep()
    assert _suspension(machines, info.id) is Suspension.FROZEN
    clock.advance(600.0)
    machines.idle.sweep()
    reason = host_swap_reason()
    described = next(i for i in machines.list() if i.id == info.id)
    if reason is None:  # the host has swap: its memory was pushed out of RAM, the processes kept
        assert described.suspension is Suspension.HIBERNATED and described.hibernate_reason is None
        assert machines.idle.last_hibernate is not None
        before, after = machines.idle.last_hibernate
        assert after < before
    else:  # no swap: it stays frozen, and says why
        assert described.suspension is Suspension.FROZEN
        assert described.hibernate_reason == reason
        assert "no swap" in reason or "swap is full" in reason
    assert _kernel_frozen(machines, info.id)
    at_wake = _count(machines, info.id)  # the exec wakes it
    assert _suspension(machines, info.id) is Suspension.RUNNING
    assert machines.exec(info.id, f"kill -0 {pid}").exit_code == 0  # the same process lived through it
    _until(lambda: _count(machines, info.id) > at_wake, "the counter goes on")
