"""Hibernation through the user's door: a Boxd script (``python script.py``) whose machine holds 100 MB and a
token in the memory of a background process, left idle past the client's ``hibernate_s``.

Where the host has swap, the machine is hibernated: its memory cgroup says most of the 100 MB left RAM (read from
the kernel by the test, not from the client), and the next exec wakes it with the same process answering the same
token. Where it has none, the machine stays frozen and says why (``hibernate_reason``), and an exec wakes it all
the same. The swap case makes a swap file of its own for the test when the host has none and the test runs as
root (and removes it after); swarmyard itself never adds swap to a host (see :mod:`swarmyard.machines.idle`).

Real time here (a script's own clock): every wait is bounded by progress, the script polling the machine's state.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.machines.cgroups import discover
from swarmyard.machines.idle import host_swap_reason

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

_HOLDER = r'''
import secrets, socket
state = bytearray(secrets.token_bytes(100 << 20))
token = secrets.token_hex(16)
server = socket.socket()
server.bind(("127.0.0.1", 7359))
server.listen()
open("/home/boxd/holder.ready", "w").write("up")
while True:
    conn, _ = server.accept()
    conn.sendall(f"{token} {len(state)} {sum(state[::4096])}".encode())
    conn.close()
'''

_SCRIPT = r'''
import json, sys, time
from swarmyard.boxd import Boxd

def until(check, what, limit_s=120.0):
    end = time.monotonic() + limit_s
    while not (found := check()):
        if time.monotonic() > end:
            raise SystemExit(f"never: {what}")
        time.sleep(0.05)  # a poll's pace, not a wait for something to happen: the loop ends on what it sees
    return found

ask = ("import socket\n"
       "with socket.create_connection(('127.0.0.1', 7359), timeout=30) as c: print(c.recv(200).decode())")
boxd = Boxd(providers=sys.argv[1], root=sys.argv[2], idle_suspend_s=1, hibernate_s=2)
machine = boxd.machines.create("holder")
boxd.machines.wait_until_ready(machine.id)
boxd.machines.files.upload(machine.id, "holder.py", open(sys.argv[3]).read())
boxd.machines.exec(machine.id, "setsid python3 holder.py </dev/null >/dev/null 2>&1 &")
boxd.machines.exec(machine.id, "while [ ! -e holder.ready ]; do sleep 0.05; done", timeout=120)
held = boxd.machines.exec(machine.id, ["python3", "-c", ask]).stdout.strip()
print(json.dumps({"held": held}), flush=True)
sys.stdin.readline()  # the test reads the machine's memory while it runs
due = lambda: (m := boxd.machines.get(machine.id)).suspension == "hibernated" or m.hibernate_reason is not None
until(due, "the idle machine is hibernated or says why not")
now = boxd.machines.get(machine.id)
print(json.dumps({"suspension": now.suspension, "reason": now.hibernate_reason}), flush=True)
sys.stdin.readline()  # the test reads it again
woken = boxd.machines.exec(machine.id, ["python3", "-c", ask])
print(json.dumps({"exit_code": woken.exit_code, "answer": woken.stdout.strip(),
                  "after": boxd.machines.get(machine.id).suspension}), flush=True)
boxd.close()
'''


@pytest.fixture
def folder() -> Iterator[Path]:
    if discover().v2 is None:
        pytest.skip("this host has no writable cgroup v2 hierarchy, so no freezer")
    path = Path(tempfile.mkdtemp(prefix="sy-hib-"))
    (path / "root").mkdir()
    (path / "providers.toml").write_text('[providers.sim]\nkind = "simulated"\nmodels = ["m1"]\n')
    (path / "script.py").write_text(_SCRIPT)
    (path / "holder.py").write_text(_HOLDER)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def swap(folder: Path) -> Iterator[None]:
    """Swap for the test's length: the host's own, else a swap file made here (root only)."""
    if host_swap_reason() is None:
        yield
        return
    if os.geteuid() != 0:
        pytest.skip("the host has no swap and only root can add some for the test")
    swapfile = folder / "swapfile"
    made = subprocess.run(["sh", "-c", f"dd if=/dev/zero of={swapfile} bs=1M count=512 status=none && "
                           f"chmod 600 {swapfile} && mkswap -q {swapfile} && swapon {swapfile}"],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"no swap file could be made for the test here: {made.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["swapoff", str(swapfile)], check=True)


def _memory_bytes(root: Path) -> int:
    """What the kernel charges to the one live machine under ``root`` (its memory cgroup, v1 or v2)."""
    [record] = root.glob("m/*/machine.json")
    pid = json.loads(record.read_text())["pid"]
    mounts = [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if "memory" in names.split(","):
            where = next(m[1] for m in mounts if m[2] == "cgroup" and "memory" in m[3].split(","))
            return int((Path(where) / path.lstrip("/") / "memory.usage_in_bytes").read_text())
    where = next(m[1] for m in mounts if m[2] == "cgroup2")
    path = next(line[3:] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if line.startswith("0::"))
    return int((Path(where) / path.lstrip("/") / "memory.current").read_text())


class _Script:
    def __init__(self, folder: Path) -> None:
        argv = [sys.executable, str(folder / "script.py"), str(folder / "providers.toml"), str(folder / "root"),
                str(folder / "holder.py")]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, cwd=folder)

    def read(self) -> dict[str, object]:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read()
        found: dict[str, object] = json.loads(line)
        return found

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_a_hibernated_machine_releases_its_memory_and_an_exec_wakes_it_with_its_process(folder: Path,
                                                                                         swap: None) -> None:
    script = _Script(folder)
    try:
        held = script.read()["held"]
        assert isinstance(held, str) and len(held.split()) == 3
        running = _memory_bytes(folder / "root")
        assert running > 100 << 20
        script.go()
        assert script.read() == {"suspension": "hibernated", "reason": None}
        hibernated = _memory_bytes(folder / "root")
        assert running - hibernated > 80 << 20, (running, hibernated)  # most of the 100 MB left RAM
        script.go()
        woken = script.read()
        # the same process (its token was in its memory only), its 100 MB read back whole
        assert woken == {"exit_code": 0, "answer": held, "after": "running"}
        assert script.proc.wait(120) == 0
    finally:
        script.end()


def test_without_swap_a_machine_due_to_hibernate_stays_frozen_and_says_why(folder: Path) -> None:
    reason = host_swap_reason()
    if reason is None:
        pytest.skip("this host has swap: its machines hibernate (the test above)")
    script = _Script(folder)
    try:
        held = script.read()["held"]
        script.go()
        assert script.read() == {"suspension": "frozen", "reason": reason}
        script.go()
        assert script.read() == {"exit_code": 0, "answer": held, "after": "running"}
        assert script.proc.wait(120) == 0
    finally:
        script.end()


def test_the_bench_hibernates_its_machine_each_round_also_after_the_holder_answered(swap: None) -> None:
    """`bench machines`' hibernate rows on a host with swap: the holder's answer over loopback is traffic the next
    sweep sees, so the bench sweeps again a minute on before it hibernates (it stopped at "not hibernated: frozen")."""
    from swarmyard.bench.machines import _hibernate_rows
    from swarmyard.bench.result import BenchResult

    result = BenchResult("machines")
    _hibernate_rows(result, 2)
    assert result.summary["hibernate_possible"] is True
    assert result.summary["hibernate_state_intact"] == "2/2"
    assert result.summary["hibernate_released_mb_p50"] > 0 and result.summary["hibernate_wake_exec_ms_p50"] > 0
