"""What a process in a governed machine could leave behind for the next one, or run past the exec allowlist:
a module in the home (or in the user site under it) does not shadow what the launcher's Pythons import (they start
with ``MACHINE_PYTHON``: neither the working folder nor the user site on ``sys.path``), and a memfd cannot be made,
so none is executed past Landlock. A machine of the ``full`` profile keeps memfds. An upload replaces what is at
its path (a slot's read-only module sent again for its next task; a symlink left there), with either init.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.machines import Isolation, Machines
from swarmyard.machines.environment import MACHINE_PYTHON
from swarmyard.machines.local import HOME, InitKind, LocalBackend
from swarmyard.machines.protocol import MachineInfo
from swarmyard.swarm.machine_launcher import _LOCKED, _REMOVE_TREE

pytestmark = [pytest.mark.bwrap]

_PLANTED = b"import sys; sys.stderr.write('SHADOWED\\n'); raise SystemExit(7)\n"
_USER_SITE = f".local/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"


@pytest.fixture
def machines(tmp_path: Path) -> Iterator[Machines]:
    with Machines(LocalBackend(tmp_path / "run")) as machines:
        yield machines


@pytest.fixture
def governed(machines: Machines) -> MachineInfo:
    return machines.wait_until_ready(machines.create("g", isolation=Isolation(exec_only=(sys.executable,))).id)


def test_a_module_planted_in_the_home_does_not_run_in_the_agent_or_the_helpers(machines: Machines,
                                                                               governed: MachineInfo) -> None:
    for name in ("httpx.py", "asyncio.py", "shutil.py", f"{_USER_SITE}/httpx.py"):
        machines.files.upload(governed.id, name, _PLANTED)
    machines.files.upload(governed.id, f"{_USER_SITE}/planted.pth", b"import sys; sys.stderr.write('SHADOWED\\n')\n")
    # what a bare interpreter would have done: the planted asyncio is what it imports
    bare = machines.exec(governed.id, [sys.executable, "-c", "import asyncio"], cwd=HOME, timeout=60)
    assert b"SHADOWED" in bare.stderr
    agent = machines.exec(governed.id, [*MACHINE_PYTHON, "-m", "swarmyard.agents"], cwd=HOME, timeout=60,
                          env={"SWARMYARD_PROFILE": "governed"})
    assert b"SHADOWED" not in agent.stderr
    assert b"agent error" in agent.stderr  # its own refusal (no plane URL), after its real imports
    machines.files.upload(governed.id, "task/a.txt", b"x")
    # as the launcher runs it in a governed machine: its exec locked first
    helper = machines.exec(governed.id, [*MACHINE_PYTHON, "-c", _LOCKED + _REMOVE_TREE, "task"], cwd=HOME,
                           timeout=60)
    assert helper.ok and b"SHADOWED" not in helper.stderr
    left = machines.exec(governed.id, [*MACHINE_PYTHON, "-c", "import os; print(os.path.exists('task'))"],
                         cwd=HOME, timeout=60)
    assert left.stdout == b"False\n"


_MEMFD_EXEC = (
    "import os\n"
    "try:\n"
    "    fd = os.memfd_create('x')\n"
    "except OSError as exc:\n"
    "    print('refused', exc.errno); raise SystemExit(0)\n"
    "os.write(fd, open('/bin/true', 'rb').read())\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    try:\n"
    "        os.execve(fd, ['true'], {})\n"
    "    finally:\n"
    "        os._exit(9)\n"
    "print('ran', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
)


def test_a_governed_machine_makes_no_memfd_to_execute(machines: Machines, governed: MachineInfo) -> None:
    import errno

    done = machines.exec(governed.id, [*MACHINE_PYTHON, "-c", _MEMFD_EXEC], timeout=60)
    assert done.stdout == f"refused {errno.ENOSYS}\n".encode(), done.stderr


def test_a_full_machine_keeps_its_memfds(machines: Machines) -> None:
    info = machines.wait_until_ready(machines.create("full").id)
    done = machines.exec(info.id, [*MACHINE_PYTHON, "-c", _MEMFD_EXEC], timeout=60)
    assert done.stdout == b"ran 0\n", done.stderr


@pytest.mark.parametrize("init", ["native", "python"])
def test_an_upload_replaces_a_read_only_file_and_a_symlink(tmp_path: Path, init: InitKind) -> None:
    with Machines(LocalBackend(tmp_path / "run", init=init)) as machines:
        info = machines.wait_until_ready(machines.create("g", isolation=Isolation(exec_only=(sys.executable,))).id)
        machines.files.upload(info.id, ".swarmyard/wasi/m.wasm", b"first", mode=0o400)
        machines.files.upload(info.id, ".swarmyard/wasi/m.wasm", b"second", mode=0o400)  # a slot's next task
        assert machines.files.download(info.id, ".swarmyard/wasi/m.wasm") == b"second"
        machines.files.upload(info.id, "target", b"kept")
        made = machines.exec(info.id, [*MACHINE_PYTHON, "-c", "import os; os.symlink('target', 'link')"],
                             cwd=HOME, timeout=60)
        assert made.ok, made.stderr
        machines.files.upload(info.id, "link", b"new")
        looked = machines.exec(info.id, [*MACHINE_PYTHON, "-c", "import os; print(os.path.islink('link'), "
                                         "oct(os.stat('.swarmyard/wasi/m.wasm').st_mode & 0o777))"],
                               cwd=HOME, timeout=60)
        assert looked.stdout == b"False 0o400\n"
        assert machines.files.download(info.id, "target") == b"kept"
        assert machines.files.download(info.id, "link") == b"new"
