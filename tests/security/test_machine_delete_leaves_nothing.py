"""A machine's delete leaves none of its processes on the host, at once, even with the host under load.

A Boxd script (``python script.py``, as a user runs one) starts two machines: one runs a fork bomb against its
pids limit, the other holds a few hundred sleeping processes and keeps the host's CPUs busy. The bomb's machine is
deleted while the other one loads the host; right after ``delete`` returns, the script looks at every process of
the host: none is in the deleted machine's cgroups (its ``/proc/PID/cgroup`` names them, as a zombie's still does),
and its cgroup folders are gone. Then the same for the second machine, sleepers and all.

The fallback for hosts whose kernel has no ``cgroup.kill`` (before 5.14: freeze the group, SIGKILL each process)
is tried on this host's real cgroups with ``cgroup.kill`` left unused, on a real fork bomb.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.ids import new_id
from swarmyard.machines.cgroups import MachineCgroups, discover, group_folders
from swarmyard.machines.protocol import Limits

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

_SCRIPT = r'''
import json, sys, threading, time
from pathlib import Path
from swarmyard.boxd import Boxd
from swarmyard.machines.cgroups import discover, group_folders

BOMB = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
# 300 sleepers, and two shells that never stop computing
LOAD = "for i in $(seq 300); do sleep 600 & done; (while :; do :; done) & while :; do :; done"
root = Path(sys.argv[2])


def folder_of(machine_id):
    """The machine's folder name, which its cgroups are named after."""
    for record in (root / "m").glob("*/machine.json"):
        if json.loads(record.read_text())["id"] == machine_id:
            return record.parent.name
    raise SystemExit(f"no record of {machine_id}")


def in_group(name):
    """Every process of the host whose cgroups name the machine's (a zombie's still do)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                # a zombie's group may be removed already: "/swarmyard/NAME (deleted)"
                lines = (proc / "cgroup").read_text().splitlines()
                if any(line.split(" (deleted)")[0].endswith(f"/swarmyard/{name}") for line in lines):
                    found.append(int(proc.name))
            except OSError:
                pass  # ended while we looked
    return found


def run(machine_id, command):
    try:
        boxd.machines.exec(machine_id, command, timeout=600)
    except Exception as exc:  # the machine is deleted under it
        print(f"exec ended: {type(exc).__name__}", file=sys.stderr)


boxd = Boxd(providers=sys.argv[1], root=str(root))
machines = [boxd.machines.create(name) for name in ("bomb", "load")]
commands = [["python3", "-c", BOMB], ["sh", "-c", LOAD]]
names = {}
for machine, command in zip(machines, commands):
    boxd.machines.wait_until_ready(machine.id)
    names[machine.id] = folder_of(machine.id)
    threading.Thread(target=run, args=(machine.id, command), daemon=True).start()
before = {}
for machine in machines:
    for _ in range(6000):  # until the bomb or the sleepers are there (bounded by progress, not a fixed time)
        before[machine.id] = len(in_group(names[machine.id]))
        if before[machine.id] >= 300:
            break
        time.sleep(0.01)
report = []
for machine in machines:  # the bomb is deleted while the other machine loads the host
    name = names[machine.id]
    other = [m for m in machines if m.id != machine.id and m.id in names]
    busy = len(in_group(names[other[0].id])) if other else 0
    started = time.monotonic()
    boxd.machines.delete(machine.id)
    took = time.monotonic() - started
    left = in_group(name)
    groups = [str(g) for g in group_folders(discover(), name) if g.exists()]
    report.append({"id": machine.id, "before": before[machine.id], "other_busy": busy, "left": left,
                   "groups": groups, "delete_s": round(took, 3)})
    del names[machine.id]
print(json.dumps(report), flush=True)
boxd.close()
'''


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-del-"))
    (path / "root").mkdir()
    (path / "providers.toml").write_text('[providers.sim]\nkind = "simulated"\nmodels = ["m1"]\n')
    (path / "script.py").write_text(_SCRIPT)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_deleted_machine_leaves_no_process_and_no_cgroup_while_another_loads_the_host(folder: Path) -> None:
    done = subprocess.run([sys.executable, str(folder / "script.py"), str(folder / "providers.toml"),
                           str(folder / "root")], capture_output=True, text=True, cwd=folder, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print("delete took", [m["delete_s"] for m in report], "s")  # for the reader; nothing is timed
    assert len(report) == 2
    for machine in report:
        assert machine["before"] >= 300, machine  # it ran: the check below had processes to find
        assert machine["left"] == [], f"processes of {machine['id']} outlived its delete: {machine}"
        assert machine["groups"] == [], f"cgroups of {machine['id']} outlived its delete: {machine}"
    assert report[0]["other_busy"] >= 300  # the bomb's delete ran while the other machine loaded the host


_BOMB = "import os, sys\nsys.stdin.read(1)\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"


def _in_group(name: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                lines = (proc / "cgroup").read_text().splitlines()
                if any(line.split(" (deleted)")[0].endswith(f"/swarmyard/{name}") for line in lines):
                    found.append(int(proc.name))
            except OSError:
                continue  # ended while we looked
    return found


def test_without_cgroup_kill_a_fork_bomb_is_frozen_killed_and_its_groups_removed() -> None:
    host = discover()
    if host.v2 is None and not host.v1:
        pytest.skip("no writable cgroups on this host")
    # this host's real hierarchy, as a kernel before 5.14 offers it: no cgroup.kill
    old_kernel = dataclasses.replace(host, v2_kill=False)
    name = f"test-{new_id('k').lower()}"
    groups = MachineCgroups(old_kernel, name, Limits(memory_bytes=None, pids=200, cpus=None),
                            controllers={"pids"})
    assert groups.kill_file is None and groups.dirs
    bomb = subprocess.Popen([sys.executable, "-c", _BOMB], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    assert bomb.stdin is not None
    try:
        for procs in groups.procs_files:
            Path(procs).write_text(str(bomb.pid))
        bomb.stdin.write(b"x")
        bomb.stdin.flush()
        filled = threading.Event()
        for _ in range(6000):  # until the bomb fills its pids limit (bounded by progress)
            if len(groups.pids()) >= 150:
                break
            filled.wait(0.01)
        assert len(groups.pids()) >= 150
        groups.kill()
        bomb.wait(30)  # our own child: reaped here; every other process of the bomb was the init's to reap
        assert groups.pids() == set()
        groups.remove()
        assert [g for g in group_folders(old_kernel, name) if g.exists()] == []
        # no process of the group is left running (an orphan killed in it may wait a moment for the host's init)
        assert all(_state(pid) in ("Z", "X", "") for pid in _in_group(name))
    finally:
        if bomb.poll() is None:
            bomb.kill()
            bomb.wait()
        MachineCgroups(host, name, adopt=True).remove()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""

