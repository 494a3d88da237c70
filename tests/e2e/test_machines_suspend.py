"""Suspend on idle through the user's door: a Boxd script (``python script.py``) whose machine, left idle for the
client's ``idle_suspend_s``, is frozen (the client says ``suspension == "frozen"`` and the kernel says ``frozen 1``
for its cgroup), then woken by the next exec with its state intact: the background process that keeps a counter
in a file is the same process, and its counter goes on from where it stopped.

Real time here (a script's own clock): every wait is bounded by progress, the script polling the machine's state.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.machines.cgroups import discover

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

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

boxd = Boxd(providers=sys.argv[1], root=sys.argv[2], idle_suspend_s=2)
machine = boxd.machines.create("sleeper")
boxd.machines.wait_until_ready(machine.id)
pid = boxd.machines.exec(machine.id, "(i=0; while :; do i=$((i+1)); echo $i > count; sleep 0.01; done) "
                                     "</dev/null >/dev/null 2>&1 & echo $!").stdout.strip()
count = lambda: int(boxd.machines.exec(machine.id, "cat count").stdout or "0")
until(lambda: count() > 0, "the counter counts")
until(lambda: boxd.machines.get(machine.id).suspension == "frozen", "the idle machine is frozen")
print(json.dumps({"frozen": boxd.machines.get(machine.id).suspension, "status": boxd.machines.get(machine.id).status}),
      flush=True)
sys.stdin.readline()  # the test looks at the kernel's side meanwhile
woken = boxd.machines.exec(machine.id, f"kill -0 {pid} && cat count")
after = boxd.machines.get(machine.id).suspension
at_wake = int(woken.stdout)
went_on = until(lambda: (n := count()) > at_wake and n, "the counter goes on")
print(json.dumps({"exit_code": woken.exit_code, "after": after, "at_wake": at_wake, "went_on": went_on}), flush=True)
boxd.close()
'''


@pytest.fixture
def folder() -> Iterator[Path]:
    if discover().v2 is None:
        pytest.skip("this host has no writable cgroup v2 hierarchy, so no freezer")
    path = Path(tempfile.mkdtemp(prefix="sy-idle-"))
    (path / "root").mkdir()
    (path / "providers.toml").write_text('[providers.sim]\nkind = "simulated"\nmodels = ["m1"]\n')
    (path / "script.py").write_text(_SCRIPT)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _kernel_frozen(root: Path) -> list[bool]:
    """For every live machine under ``root`` (its record names its sandbox's host pid): whether the kernel says
    its cgroup v2 group is frozen."""
    mount = next(line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
                 if line.split()[2] == "cgroup2")
    frozen = []
    for record in root.glob("m/*/machine.json"):
        pid = json.loads(record.read_text())["pid"]
        path = next(line[3:] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                    if line.startswith("0::"))
        events = (Path(mount) / path.lstrip("/") / "cgroup.events").read_text().splitlines()
        frozen.append("frozen 1" in events)
    return frozen


def test_an_idle_machine_of_a_boxd_script_is_frozen_and_an_exec_wakes_it_with_its_processes(folder: Path) -> None:
    script = subprocess.Popen([sys.executable, str(folder / "script.py"), str(folder / "providers.toml"),
                               str(folder / "root")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=folder)
    assert script.stdin is not None and script.stdout is not None and script.stderr is not None
    try:
        line = script.stdout.readline()
        assert line, script.stderr.read()
        assert json.loads(line) == {"frozen": "frozen", "status": "running"}
        assert _kernel_frozen(folder / "root") == [True]
        script.stdin.write("go\n")
        script.stdin.flush()
        line = script.stdout.readline()
        assert line, script.stderr.read()
        woken = json.loads(line)
        assert woken["exit_code"] == 0  # the counter's process lived through the freeze
        assert woken["after"] == "running"
        assert woken["went_on"] > woken["at_wake"] > 0
        assert script.wait(120) == 0, script.stderr.read()
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
