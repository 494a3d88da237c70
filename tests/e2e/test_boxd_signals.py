"""A Boxd script ended from outside leaves nothing behind: a user's script (``python script.py``) with a machine
running a command gets SIGTERM and exits 143 (or Ctrl-C), its machine's processes, cgroups and folders and its embedded plane's
folder gone; after a SIGKILL, which no process can clean up after, the next Boxd client on the host removes what
it left (the machines' folders and cgroups, and the plane's folder).
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.boxd import Boxd
from swarmyard.machines.cgroups import discover, group_folders

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

_SCRIPT = '''
import sys
from swarmyard.boxd import Boxd
boxd = Boxd(providers=sys.argv[1], root=sys.argv[2])
machine = boxd.machines.create("busy")
boxd.machines.wait_until_ready(machine.id)
print("ready", flush=True)
boxd.machines.exec(machine.id, "sleep 600")  # ended from outside while it waits here
'''


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-sg-"))
    (path / "root").mkdir()
    (path / "providers.toml").write_text('[providers.sim]\nkind = "simulated"\nmodels = ["m1"]\n')
    (path / "script.py").write_text(_SCRIPT)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _start(folder: Path) -> subprocess.Popen[str]:
    script = subprocess.Popen([sys.executable, str(folder / "script.py"), str(folder / "providers.toml"),
                               str(folder / "root")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=folder)
    assert script.stdout is not None
    assert script.stdout.readline().strip() == "ready", script.stderr.read() if script.stderr else ""
    return script


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process still running (not a zombie its new parent has yet to reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cgroup_pids(name: str) -> set[int]:
    pids: set[int] = set()
    for group in group_folders(discover(), name):
        try:
            pids |= {int(p) for p in (group / "cgroup.procs").read_text().split()}
        except OSError:
            continue
    return pids


def _state(folder: Path, pid: int) -> tuple[list[str], set[int], list[Path]]:
    """The script's machine folders, every process in their cgroups (once its command runs), its plane's folder."""
    names = sorted(p.name for p in (folder / "root" / "m").iterdir())
    record = [n for n in names if (folder / "root" / "m" / n / "machine.json").exists()]
    assert len(record) == 1, names
    waited = threading.Event()
    for _ in range(3000):  # the exec's command appears in the machine's groups (bounded by progress, not time)
        pids = _cgroup_pids(record[0])
        if any(_comm(p) == "sleep" for p in pids):
            break
        waited.wait(0.02)
    else:
        pytest.fail("the machine's command never started")
    pids = set().union(*(_cgroup_pids(n) for n in names))
    planes = [p for p in Path(tempfile.gettempdir()).glob("sy-boxd-*")
              if (p / "owner").exists() and (p / "owner").read_text().split()[0] == str(pid)]
    assert len(planes) == 1
    return names, pids, planes


def _gone(names: list[str], pids: set[int], planes: list[Path], folder: Path) -> None:
    assert [n for n in names if (folder / "root" / "m" / n).exists()] == []
    assert [g for n in names for g in group_folders(discover(), n) if g.exists()] == []
    assert [p for p in pids if _running(p) and _comm(p) in ("sleep", "bwrap", "init")] == []
    assert [p for p in planes if p.exists()] == []


# SIGTERM: exit status 143, as a shell reports a process it ended; Ctrl-C: Python's own KeyboardInterrupt exit
@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, -signal.SIGINT)])
def test_a_signal_deletes_the_machines_and_the_plane(folder: Path, sig: signal.Signals, status: int) -> None:
    script = _start(folder)
    try:
        names, pids, planes = _state(folder, script.pid)
        script.send_signal(sig)
        assert script.wait(120) == status, script.stderr.read() if script.stderr else ""
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
    _gone(names, pids, planes, folder)


def _tgkill(pid: int, tid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to one thread of ``pid`` (``tgkill(2)``): where the kernel may hand a signal sent to the process."""
    number = {"x86_64": 234, "aarch64": 131}[platform.machine()]  # SYS_tgkill
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, pid, tid, int(sig)) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")


def test_a_sigterm_the_kernel_hands_to_another_thread_still_ends_the_script(folder: Path) -> None:
    """The kernel gives a signal sent to the process to any thread that does not block it; Python runs its handler
    in the main thread only, once that thread leaves its system call. The script's main thread waits on its
    machine's 600-second command: SIGTERM delivered to one of the client's own threads must end it all the same
    (it waited for the command's end before)."""
    script = _start(folder)
    try:
        names, pids, planes = _state(folder, script.pid)
        others = [int(t) for t in os.listdir(f"/proc/{script.pid}/task") if int(t) != script.pid]
        assert others  # the plane's server, the claims' renewer, the launchers...
        _tgkill(script.pid, others[0], signal.SIGTERM)
        assert script.wait(120) == 143, script.stderr.read() if script.stderr else ""
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
    _gone(names, pids, planes, folder)


def _made(name: str) -> str:
    """The name a machine folder listed while it was being made (``.NAME.PID.START``, see ``make_folder``) has
    once made: the script's launcher pool parks launchers, each in a folder of its own, while the script runs."""
    parts = name.split(".")
    return parts[1] if name.startswith(".") and len(parts) == 4 else name


def test_what_a_sigkill_leaves_is_reaped_by_the_next_client(folder: Path) -> None:
    script = _start(folder)
    try:
        names, pids, planes = _state(folder, script.pid)
        script.kill()
        assert script.wait(60) == -signal.SIGKILL
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
    machines = folder / "root" / "m"
    # nothing could remove them yet: each folder listed while the script ran is there, under the name it was
    # being made under or the one it was renamed to before the kill
    assert all((machines / n).exists() or (machines / _made(n)).exists() for n in names), (names, os.listdir(machines))
    names = sorted(os.listdir(machines))  # all of what it left, folders it began after the listing included
    assert all(p.exists() for p in planes)
    with Boxd(providers=folder / "providers.toml", root=folder / "root") as boxd:
        fresh = boxd.machines.create("fresh")
        boxd.machines.wait_until_ready(fresh.id)
        _gone(names, pids, planes, folder)
    assert os.listdir(folder / "root" / "m") == []
