"""The routes around a governed machine's exec allowlist that go through the ELF loader or the machine's init.

Landlock's execute right is checked at ``execve``; the loader (``ld.so``), which every dynamically linked program
needs and the allowlist therefore holds, maps whatever file it is given without one. So: every writable mount is
``noexec`` (a program written there can neither run nor be mapped executable, by ld.so or anyone), swarmyard's
own processes lock exec for themselves before they read anything a model wrote (after which ``ld.so /bin/sh``
fails too), and the init's control socket serves the host only (through it, a locked process could have had the
init run the loader for it), nor can its memory be written. A full machine keeps an executable workspace. Each
with both inits.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.machines import Isolation, Machines
from swarmyard.machines.environment import MACHINE_PYTHON
from swarmyard.machines.execs import interpreter_of
from swarmyard.machines.local import HOME, InitKind, LocalBackend
from swarmyard.machines.protocol import MachineInfo

pytestmark = [pytest.mark.bwrap]

LOADER = interpreter_of(sys.executable) or "/lib64/ld-linux-x86-64.so.2"


@pytest.fixture(params=["native", "python"])
def machines(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Machines]:
    init: InitKind = request.param
    with Machines(LocalBackend(tmp_path / "run", init=init)) as machines:
        yield machines


@pytest.fixture
def governed(machines: Machines) -> MachineInfo:
    return machines.wait_until_ready(machines.create("g", isolation=Isolation(exec_only=(sys.executable,))).id)


def _run(machines: Machines, info: MachineInfo, code: str, **env: str) -> list[str]:
    done = machines.exec(info.id, [*MACHINE_PYTHON, "-c", code], cwd=HOME, timeout=60, env=env or None)
    assert done.exit_code == 0, done.stderr
    return done.stdout.decode().split()


_WRITTEN = (
    "import mmap, os, shutil, subprocess, sys\n"
    "for folder in ('/machine', '/tmp'):\n"
    "    path = folder + '/mytrue'\n"
    "    shutil.copy('/bin/true', path); os.chmod(path, 0o755)\n"
    "    try:\n"
    "        subprocess.run([path]); print('RAN')\n"
    "    except PermissionError:\n"
    "        print('exec-refused')\n"
    "    loaded = subprocess.run([sys.argv[1], path], capture_output=True)\n"
    "    print('loaded' if loaded.returncode == 0 else\n"
    "          'map-refused' if b'failed to map segment' in loaded.stderr else loaded.stderr.decode())\n"
    "    with open(path, 'rb') as f:\n"
    "        try:\n"
    "            mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_EXEC)\n"
    "            print('MAPPED')\n"
    "        except PermissionError:\n"
    "            print('prot-exec-refused')\n"
)


def test_a_program_written_to_a_writable_folder_runs_neither_directly_nor_through_the_loader(
        machines: Machines, governed: MachineInfo) -> None:
    out = machines.exec(governed.id, [*MACHINE_PYTHON, "-c", _WRITTEN, LOADER], cwd=HOME, timeout=60)
    assert out.stdout.decode().split() == ["exec-refused", "map-refused", "prot-exec-refused"] * 2, out.stderr


_MOUNTS = (
    "for line in open('/proc/self/mountinfo'):\n"
    "    fields = line.split(); options = fields[5].split(',')\n"
    "    if 'rw' in options:\n"
    "        print(fields[4], 'noexec' in options)\n"
)


def test_every_writable_mount_of_a_governed_machine_is_noexec(machines: Machines, governed: MachineInfo) -> None:
    seen = dict(zip(*[iter(_run(machines, governed, _MOUNTS))] * 2, strict=True))
    assert {"/", HOME, "/tmp", "/dev", "/sys"} <= set(seen)
    assert {mount for mount, noexec in seen.items() if noexec != "True"} == set()


def test_a_full_machine_keeps_an_executable_workspace(machines: Machines) -> None:
    info = machines.wait_until_ready(machines.create("full").id)
    code = ("import shutil, subprocess\n"
            "shutil.copy('/bin/true', 'mytrue')\n"
            "print(subprocess.run(['./mytrue']).returncode, subprocess.run(['/bin/sh', '-c', 'exit 3']).returncode)\n")
    assert _run(machines, info, code) == ["0", "3"]


_LOADER_AFTER_LOCK = (
    "import subprocess, sys\n"
    "from swarmyard.guest.seccomp import lock_exec\n"
    "argv = [sys.argv[1], '/bin/sh', '-c', 'echo through-the-loader']\n"
    "print(subprocess.run(argv, capture_output=True).stdout.decode().strip())\n"
    "lock_exec()\n"
    "try:\n"
    "    subprocess.run(argv); print('ESCAPED')\n"
    "except PermissionError:\n"
    "    print('refused')\n"
)


def test_a_locked_process_cannot_start_a_shell_through_the_loader(machines: Machines,
                                                                  governed: MachineInfo) -> None:
    done = machines.exec(governed.id, [*MACHINE_PYTHON, "-c", _LOADER_AFTER_LOCK, LOADER], timeout=60)
    # before its lock, the loader runs a program of /usr for it (what the lock is for); after it, nothing runs
    assert done.stdout.decode().split() == ["through-the-loader", "refused"], done.stderr


_RELAY = (
    "import json, os, subprocess, sys\n"
    "def filters(pid):\n"
    "    return next(int(l.split()[1]) for l in open(f'/proc/{pid}/status') if l.startswith('Seccomp_filters'))\n"
    "env = {'PATH': '/usr/bin:/bin', 'SWARMYARD_TOKEN': 't', 'SWARMYARD_PLANE_URL': 'http://127.0.0.1:9'}\n"
    "if sys.argv[2]:\n"
    "    env['SWARMYARD_PROFILE'] = sys.argv[2]\n"
    "relay = subprocess.Popen([*json.loads(sys.argv[1]), '-m', 'swarmyard.cli', 'mcp'], env=env,\n"
    "                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n"
    "hello = {'jsonrpc': '2.0', 'id': 1, 'method': 'initialize', 'params': {'protocolVersion': '2025-06-18',\n"
    "         'capabilities': {}, 'clientInfo': {'name': 'probe', 'version': '1'}}}\n"
    "relay.stdin.write((json.dumps(hello) + '\\n').encode()); relay.stdin.flush()\n"
    "answer = json.loads(relay.stdout.readline())\n"
    "print(answer['result']['serverInfo']['name'], filters(relay.pid) - filters(os.getpid()))\n"
    "relay.stdin.close(); relay.wait()\n"
)


def test_the_mcp_relay_locks_exec_before_it_answers(machines: Machines, governed: MachineInfo) -> None:
    import json

    # the relay as an agent CLI starts it (swarmyard mcp, by the machine's interpreter), asked to initialize:
    # governed, it answers with one filter more than its parent holds (its exec lock); otherwise with none
    command = json.dumps(MACHINE_PYTHON)
    locked = machines.exec(governed.id, [*MACHINE_PYTHON, "-c", _RELAY, command, "governed"], timeout=60)
    assert locked.stdout.decode().split() == ["swarmyard", "1"], locked.stderr
    unlocked = machines.exec(governed.id, [*MACHINE_PYTHON, "-c", _RELAY, command, ""], timeout=60)
    assert unlocked.stdout.decode().split() == ["swarmyard", "0"], unlocked.stderr


_ASK_THE_INIT = (
    "import socket, sys\n"
    "from swarmyard.guest import wire\n"
    "if sys.argv[1] == 'locked':\n"
    "    from swarmyard.guest.seccomp import lock_exec\n"
    "    lock_exec()\n"
    "conn = socket.socket(socket.AF_UNIX)\n"
    "conn.connect('/run/swarmyard/ctl/init.sock')\n"
    "argv = [sys.executable, '-c', 'open(\"/machine/ran\", \"w\").close()']\n"
    "try:\n"
    "    wire.send_frame(conn, b'q', wire.encode_request('exec', argv=argv, env={}))\n"
    "    print('answered' if wire.recv_frame(conn) is not None else 'closed')\n"
    "except OSError:\n"
    "    print('closed')\n"
)


@pytest.mark.parametrize("profile", ["governed", "full"])
def test_the_init_serves_the_host_only(machines: Machines, profile: str) -> None:
    iso = Isolation(exec_only=(sys.executable,)) if profile == "governed" else Isolation()
    info = machines.wait_until_ready(machines.create(profile, isolation=iso).id)
    for how in ("locked", "unlocked"):
        done = machines.exec(info.id, [*MACHINE_PYTHON, "-c", _ASK_THE_INIT, how], timeout=60)
        assert done.stdout == b"closed\n", done.stderr
    nothing = _run(machines, info, "import os; print(os.path.exists('/machine/ran'))")
    assert nothing == ["False"]
    assert machines.exec(info.id, [*MACHINE_PYTHON, "-c", "print('host')"], timeout=60).stdout == b"host\n"


_INTO_THE_INIT = (
    "import os\n"
    "try:\n"
    "    open(f'/proc/{os.getppid()}/mem', 'r+b'); print('OPENED')\n"  # the init started this command
    "except PermissionError:\n"
    "    print('refused')\n"
)


def test_no_process_of_the_machine_can_write_into_its_init(machines: Machines, governed: MachineInfo) -> None:
    # the init can exec (the host's commands): its memory is no way around the machine's own processes' locks
    assert _run(machines, governed, _INTO_THE_INIT) == ["refused"]


_AS_ANOTHER_USER = '''
import json, shutil, sys, tempfile
from pathlib import Path
from swarmyard.machines import Isolation, Machines
from swarmyard.machines.local import LocalBackend
folder = Path(tempfile.mkdtemp(prefix="sy-unpriv-"))
print(folder)
code = (
    "import os, shutil, subprocess\\n"
    "rw = [l.split()[4] for l in open('/proc/self/mountinfo') if 'rw' in l.split()[5].split(',')\\n"
    "      and 'noexec' not in l.split()[5].split(',')]\\n"
    "caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapPrm', 'CapBnd'))]\\n"
    "shutil.copy('/bin/true', 'mytrue'); os.chmod('mytrue', 0o755)\\n"
    "loaded = subprocess.run([os.environ['LOADER'], './mytrue'], capture_output=True)\\n"
    "print(os.getuid(), rw, sorted(set(caps)), b'failed to map segment' in loaded.stderr)\\n"
)
for init in ("native", "python"):
    with Machines(LocalBackend(folder / init, init=init)) as machines:
        iso = Isolation(exec_only=(sys.executable,), allow_weaker=True)  # a user's own cgroups may lack controllers
        info = machines.wait_until_ready(machines.create("g", isolation=iso).id)
        done = machines.exec(info.id, [sys.executable, "-c", code], timeout=60, env={"LOADER": sys.argv[1]})
        print(init, done.stdout.decode().strip(), done.stderr.decode()[-300:])
'''


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None or not Path("/usr/bin/python3").is_file(),
                    reason="runs a machine as another, unprivileged user (needs root and util-linux's setpriv)")
def test_a_governed_machine_of_an_unprivileged_user_has_the_same_noexec_mounts(tmp_path: Path) -> None:
    # Not root: bwrap makes the user namespace itself, and the init nests the machine's uid in one of its own
    # (bwrap's nested one would not own the mounts it must mark noexec). The system's interpreter: the one this
    # test runs may live in a folder other users cannot read.
    from swarmyard.machines.supervised import SOURCE_ROOT

    loader = interpreter_of(os.path.realpath("/usr/bin/python3")) or LOADER
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "PYTHONPATH": SOURCE_ROOT, "LANG": "C.UTF-8"}
    done = subprocess.run(["setpriv", "--reuid", "4321", "--regid", "4321", "--clear-groups", "/usr/bin/python3",
                           "-c", _AS_ANOTHER_USER, loader], env=env, cwd="/tmp", capture_output=True, text=True,
                          timeout=300)
    lines = done.stdout.splitlines()
    try:
        assert done.returncode == 0, done.stderr[-3000:]
        # as uid 1000, no rw mount without noexec, no capability left, and a copied program not loadable
        assert [line.strip() for line in lines[1:]] == [f"{init} 1000 [] ['0000000000000000'] True"
                                                        for init in ("native", "python")], done.stdout
    finally:
        if lines:
            shutil.rmtree(lines[0], ignore_errors=True)


_VIEW_UNDER_TMP = '''
import importlib.util, sys, sysconfig
from pathlib import Path
from swarmyard.machines import Isolation, Machines
from swarmyard.machines.environment import MACHINE_PYTHON
from swarmyard.machines.local import HOME, LocalBackend
module = sys.argv[3]
load = ("import importlib.util; spec = importlib.util.spec_from_file_location('_json', %r); "
        "spec.loader.exec_module(importlib.util.module_from_spec(spec)); print('loaded')" % module)
with Machines(LocalBackend(Path(sys.argv[1]), init=sys.argv[2])) as machines:
    info = machines.wait_until_ready(machines.create("g", isolation=Isolation(exec_only=(sys.executable,))).id)
    done = machines.exec(info.id, [*MACHINE_PYTHON, "-c", load], cwd=HOME, timeout=60)
    print(done.stdout.decode().strip() or done.stderr.decode()[-400:])
'''


@pytest.mark.parametrize("init", ["native", "python"])
def test_an_interpreter_installed_under_tmp_keeps_its_compiled_modules(tmp_path: Path, init: str) -> None:
    """A governed machine marks /tmp noexec with what is mounted beneath it: but not the read-only view of an
    interpreter whose packages live there (a virtual environment under /tmp), whose compiled modules must load."""
    import sysconfig

    venv = Path(tempfile.mkdtemp(prefix="sy-venv-", dir="/tmp"))
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        site = next((venv / "lib").glob("python3*/site-packages"))
        # swarmyard and its packages for the host side: this interpreter's site folder, with its own .pth files
        (site / "parent.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
        compiled = Path(importlib.util.find_spec("_json").origin or "")  # a compiled module of the stdlib
        module = site / compiled.name
        shutil.copy(compiled, module)
        done = subprocess.run([str(venv / "bin" / "python"), "-c", _VIEW_UNDER_TMP, str(tmp_path / "run"), init,
                               str(module)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip().splitlines()[-1] == "loaded", done.stdout[-2000:]
    finally:
        shutil.rmtree(venv, ignore_errors=True)
