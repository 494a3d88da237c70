"""A governed machine (``Isolation(exec_only=...)``) executes only its agent's interpreter: ``exec`` of ``/bin/sh``
fails at the sandbox, with either init; so does a shell the interpreter itself tries to start, and a program
written to the machine's own disk. The agent's exec lock then takes even its interpreter away. The ``process``
backend, which cannot enforce any of it, refuses such a machine.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.errors import SandboxError, SandboxUnavailableError
from swarmyard.machines import Isolation, Machines
from swarmyard.machines.local import LocalBackend
from swarmyard.machines.process import ProcessBackend
from swarmyard.machines.protocol import MachineInfo

pytestmark = [pytest.mark.bwrap]

PYTHON = sys.executable


@pytest.fixture(params=["native", "python"])
def governed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Machines, MachineInfo]]:
    machines = Machines(LocalBackend(tmp_path / "run", init=request.param))
    info = machines.create("governed", isolation=Isolation(exec_only=(PYTHON,)))
    ready = machines.wait_until_ready(info.id)
    try:
        yield machines, ready
    finally:
        machines.close()


def test_exec_of_a_shell_fails_at_the_sandbox(governed: tuple[Machines, MachineInfo]) -> None:
    machines, info = governed
    assert "exec-only" in info.enforced
    for program in ("/bin/sh", "/usr/bin/env", "/bin/true"):
        with pytest.raises(SandboxError, match="Permission denied"):
            machines.exec(info.id, [program, "-c", "echo escaped"], timeout=30)
    ran = machines.exec(info.id, [PYTHON, "-c", "print('agent runs')"], timeout=30)
    assert ran.ok and ran.stdout == b"agent runs\n"


def test_the_interpreter_cannot_start_a_shell_or_a_program_it_wrote(governed: tuple[Machines, MachineInfo]) -> None:
    machines, info = governed
    code = (
        "import os, shutil, subprocess\n"
        "shutil.copy('/bin/sh', 'mysh'); os.chmod('mysh', 0o755)\n"
        "for argv in (['/bin/sh', '-c', 'echo escaped'], ['./mysh', '-c', 'echo escaped']):\n"
        "    try:\n"
        "        subprocess.run(argv, check=False); print('ESCAPED')\n"
        "    except PermissionError:\n"
        "        print('refused')\n"
    )
    result = machines.exec(info.id, [PYTHON, "-c", code], timeout=30)
    assert result.stdout.decode().split() == ["refused", "refused"], result.stderr


def test_the_exec_lock_takes_the_interpreter_away_too(governed: tuple[Machines, MachineInfo]) -> None:
    machines, info = governed
    code = (
        "import subprocess, sys\n"
        "from swarmyard.guest.seccomp import lock_exec\n"
        "print(subprocess.run([sys.executable, '-c', 'print(1)'], capture_output=True).stdout.decode().strip())\n"
        "lock_exec()\n"
        "try:\n"
        "    subprocess.run([sys.executable, '-c', 'print(1)']); print('ESCAPED')\n"
        "except PermissionError:\n"
        "    print('refused')\n"
    )
    result = machines.exec(info.id, [PYTHON, "-c", code], timeout=30)
    assert result.stdout.decode().split() == ["1", "refused"], result.stderr


def test_a_full_machine_still_has_its_shell(tmp_path: Path) -> None:
    with Machines(LocalBackend(tmp_path / "run")) as machines:
        info = machines.wait_until_ready(machines.create("full").id)
        assert "exec-only" not in info.enforced
        assert machines.exec(info.id, ["/bin/sh", "-c", "echo shell"], timeout=30).stdout == b"shell\n"


def test_the_process_backend_refuses_a_governed_machine(tmp_path: Path) -> None:
    with Machines(ProcessBackend(tmp_path / "run")) as machines:
        with pytest.raises(SandboxUnavailableError, match="exec_only"):
            machines.create("governed", isolation=Isolation(exec_only=(PYTHON,)))
        assert [m.state.value for m in machines.list()] in ([], ["deleted"])  # nothing left running


def test_an_unknown_profile_stops_the_agent_before_it_runs() -> None:
    env = {"PATH": "/usr/bin:/bin", "SWARMYARD_PLANE_URL": "http://127.0.0.1:9", "SWARMYARD_TOKEN": "t",
           "SWARMYARD_PROFILE": "bogus"}
    bad = subprocess.run([PYTHON, "-m", "swarmyard.agents"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "config_error" in bad.stderr and "SWARMYARD_PROFILE" in bad.stderr
