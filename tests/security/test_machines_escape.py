"""The escape suite: from inside a ``local`` machine, every way out is tried, and each must fail in a known way."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.machines import Limits, Machines
from swarmyard.machines.local import LocalBackend
from swarmyard.machines.protocol import MachineInfo

FAKE_KEY = "sk-test-swarmyard-escape-0123456789abcdef"


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Machines, MachineInfo, Path]]:
    """A provider key planted in the host's environment and in a key file, then a machine with a plane socket."""
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    key_file = tmp_path / "keys" / "openai.key"
    key_file.parent.mkdir()
    key_file.write_text(FAKE_KEY)
    plane = tmp_path / "plane.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(plane))
    server.listen(1)
    backend = LocalBackend(tmp_path / "run")
    backend.park()  # the victim boots the way machines usually do: through a launcher parked in fresh cgroups
    machines = Machines(backend)
    info = machines.create("victim", control_socket=plane, limits=Limits(memory_bytes=64 << 20, pids=64))
    machines.wait_until_ready(info.id)
    assert "/m/slot_" in (info.disk or "")
    try:
        yield machines, info, key_file
    finally:
        machines.close()
        server.close()


def _py(machines: Machines, info: MachineInfo, code: str, timeout: float = 30) -> str:
    result = machines.exec(info.id, ["python3", "-c", code], timeout=timeout)
    return (result.stdout + result.stderr).decode(errors="replace").strip()


def _errno_of(machines: Machines, info: MachineInfo, code: str) -> str:
    return _py(
        machines,
        info,
        f"import errno\ntry:\n    {code}\n    print('ESCAPED')\n"
        "except OSError as e:\n    print(errno.errorcode.get(e.errno, e.errno))",
    )


def test_no_provider_key_anywhere_inside(world: tuple[Machines, MachineInfo, Path]) -> None:
    machines, info, key_file = world
    result = machines.exec(
        info.id,
        "env; cat /proc/*/environ 2>/dev/null; grep -rsl sk-test /machine /tmp /run /etc 2>/dev/null | head",
        timeout=60,
    )
    assert FAKE_KEY.encode() not in result.stdout + result.stderr
    assert _errno_of(machines, info, f"open({str(key_file)!r})") == "ENOENT"


def test_host_root_home_and_tmp_are_not_visible(
    world: tuple[Machines, MachineInfo, Path], tmp_path: Path
) -> None:
    machines, info, _ = world
    probe = Path("/root") / f".swarmyard-escape-{os.getpid()}"
    probe.write_text("host")
    try:
        assert _errno_of(machines, info, f"open({str(probe)!r})") == "ENOENT"
    finally:
        probe.unlink()
    # The sandbox's /tmp is its own tmpfs; the only host folders in it are read-only binds of where this Python
    # and swarmyard live, when those happen to be under /tmp (a checkout in /tmp, say).
    from swarmyard.machines.local import python_paths

    allowed = sorted({p.split("/")[2] for p in python_paths() if p.startswith("/tmp/")})
    planted = Path("/tmp") / f"swarmyard-escape-{os.getpid()}"
    planted.write_text("host")
    try:
        # the host's /home is not there: the machine's own /home holds only boxd's home, a link to its own disk
        seen = _py(machines, info, "import os;print(os.listdir('/home'), os.readlink('/home/boxd'), "
                                   "sorted(os.listdir('/tmp')))")
    finally:
        planted.unlink()
    assert seen == f"['boxd'] /machine {allowed}"
    assert _errno_of(machines, info, f"open({str(tmp_path / 'run' / 'etc' / 'passwd')!r})") == "ENOENT"


def test_proc_1_environ_is_the_sandbox_not_the_host(world: tuple[Machines, MachineInfo, Path]) -> None:
    machines, info, _ = world
    environ = _py(machines, info, "print(open('/proc/1/environ','rb').read())")
    assert FAKE_KEY not in environ and "bwrap" not in _py(
        machines, info, "import os;print(os.uname().nodename)"
    )
    assert (
        int(_py(machines, info, "import os;print(len([p for p in os.listdir('/proc') if p.isdigit()]))")) < 10
    )


def test_other_machines_disk_is_unreachable(world: tuple[Machines, MachineInfo, Path]) -> None:
    machines, info, _ = world
    other = machines.create("other")
    machines.files.upload(other.id, "secret.txt", b"other's")
    assert _errno_of(machines, info, f"open({str(Path(other.disk or '') / 'secret.txt')!r})") == "ENOENT"


def test_writes_outside_the_disk_fail(world: tuple[Machines, MachineInfo, Path]) -> None:
    machines, info, _ = world
    assert _errno_of(machines, info, "open('/usr/evil','w')") in {"EROFS", "EACCES"}
    assert _errno_of(machines, info, "open('/run/swarmyard/evil','w')") in {"EROFS", "EACCES"}
    assert _errno_of(machines, info, "open('/etc/evil','w')") in {"EROFS", "EACCES"}
    # /dev/shm is a tmpfs the machine's user owns: only Landlock stops this one.
    assert _errno_of(machines, info, "open('/dev/shm/evil','w')") == "EACCES"
    assert _py(machines, info, "open('/machine/ok','w').write('x');print('ok')") == "ok"


def test_no_network_but_loopback(world: tuple[Machines, MachineInfo, Path]) -> None:
    machines, info, _ = world
    for target in ("('10.0.2.2', 80)", "('1.1.1.1', 53)", "('127.0.0.1', 22)"):
        assert _errno_of(machines, info, f"import socket;socket.create_connection({target}, timeout=2)") in {
            "ENETUNREACH",
            "ECONNREFUSED",
            "EHOSTUNREACH",
        }
    assert (
        _errno_of(
            machines,
            info,
            "import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.sendto(b'x',('8.8.8.8',53))",
        )
        == "ENETUNREACH"
    )
    assert _py(machines, info, "import socket;print(sorted(n for _,n in socket.if_nameindex()))") == "['lo']"


def test_cannot_signal_or_ptrace_host_processes(world: tuple[Machines, MachineInfo, Path]) -> None:
    machines, info, _ = world
    host = subprocess.Popen(["sleep", "60"])
    try:
        # The host pid does not exist in the machine's pid namespace.
        assert _errno_of(machines, info, f"import os;os.kill({host.pid}, 9)") == "ESRCH"
        ptrace = (
            "import ctypes;l=ctypes.CDLL(None,use_errno=True);r=l.ptrace(16,1,0,0);"
            "import os;raise OSError(ctypes.get_errno(),'') if r else None"
        )
        assert _errno_of(machines, info, ptrace) == "EPERM"
        assert host.poll() is None
    finally:
        host.kill()
        host.wait()


@pytest.mark.parametrize("request_code", [0x5412, 0x5412 | (1 << 32), 0x541C, 0x541C | (1 << 32)])
def test_tiocsti_and_tioclinux_are_denied(
    world: tuple[Machines, MachineInfo, Path], request_code: int
) -> None:
    machines, info, _ = world
    code = (
        "import ctypes,os;l=ctypes.CDLL(None,use_errno=True);fd=os.open('/dev/null',os.O_RDWR);"
        f"r=l.ioctl(fd,ctypes.c_ulong({request_code}),ctypes.c_char_p(b'x'));"
        "raise OSError(ctypes.get_errno(),'') if r else None"
    )
    assert _errno_of(machines, info, code) == "EPERM"


def test_namespace_and_mount_syscalls_denied(world: tuple[Machines, MachineInfo, Path]) -> None:
    machines, info, _ = world
    code = (
        "import ctypes;l=ctypes.CDLL(None,use_errno=True);r=l.unshare(0x10000000);"
        "raise OSError(ctypes.get_errno(),'') if r else None"
    )
    assert _errno_of(machines, info, code) == "EPERM"
    code = (
        "import ctypes;l=ctypes.CDLL(None,use_errno=True);r=l.mount(b'none',b'/tmp',b'tmpfs',0,None);"
        "raise OSError(ctypes.get_errno(),'') if r else None"
    )
    assert _errno_of(machines, info, code) == "EPERM"


def test_io_uring_is_denied(world: tuple[Machines, MachineInfo, Path]) -> None:
    """io_uring_setup, _enter and _register (425-427 on x86_64) answer EPERM; a bad call would answer EFAULT or
    EBADF if the filter let it through."""
    machines, info, _ = world
    for number, args in ((425, "1,0"), (426, "-1,0,0,0,0,0"), (427, "-1,0,0,0")):
        code = (
            f"import ctypes;l=ctypes.CDLL(None,use_errno=True);r=l.syscall({number},{args});"
            "raise OSError(ctypes.get_errno(),'') if r else None"
        )
        assert _errno_of(machines, info, code) == "EPERM", number


#: Families no machine needs, with a socket type each accepts: AF_VSOCK (a way to the hypervisor that no network
#: namespace confines; this host lets root create one), AF_PACKET, AF_BLUETOOTH, AF_ALG, AF_XDP, AF_KEY, AF_AX25.
_REFUSED_FAMILIES = {40: 1, 17: 3, 31: 3, 38: 5, 44: 3, 15: 3, 3: 5}


@pytest.mark.parametrize("call", ["socket", "socketpair", "socket-high-bit"])
def test_socket_families_but_unix_inet_and_netlink_are_refused(
    world: tuple[Machines, MachineInfo, Path], call: str
) -> None:
    """socket(2) and socketpair(2) by raw syscall (41, 53), so no library check stands in front of the filter;
    ``socket-high-bit`` sets bit 32 of the domain, which the kernel drops (it reads an int)."""
    machines, info, _ = world
    for family, kind in _REFUSED_FAMILIES.items():
        domain = family | (1 << 32) if call == "socket-high-bit" else family
        args = f"ctypes.c_long({domain}),{kind},0" + (",ctypes.byref((ctypes.c_int*2)())" if call == "socketpair" else "")
        code = (
            f"import ctypes;l=ctypes.CDLL(None,use_errno=True);r=l.syscall({53 if call == 'socketpair' else 41},{args});"
            "raise OSError(ctypes.get_errno(),'') if r < 0 else None"
        )
        assert _errno_of(machines, info, code) == "EAFNOSUPPORT", family
    # What a machine does use still works: Unix, IPv4 and IPv6 sockets, a route netlink socket, and an address
    # lookup with AI_ADDRCONFIG (for which glibc asks netlink what addresses are configured).
    allowed = (
        "import socket\n"
        "for f,t,p in ((socket.AF_UNIX,socket.SOCK_STREAM,0),(socket.AF_INET,socket.SOCK_STREAM,0),"
        "(socket.AF_INET6,socket.SOCK_DGRAM,0),(socket.AF_NETLINK,socket.SOCK_RAW,0)): socket.socket(f,t,p).close()\n"
        "[s.close() for s in socket.socketpair()]\n"
        "print(socket.getaddrinfo('127.0.0.1',80,flags=socket.AI_ADDRCONFIG)[0][4][1])"
    )
    assert _py(machines, info, allowed) == "80"


def test_memory_limit_kills(world: tuple[Machines, MachineInfo, Path]) -> None:
    machines, info, _ = world
    result = machines.exec(info.id, ["python3", "-c", "b=bytearray(256<<20);print('ESCAPED')"], timeout=30)
    assert result.exit_code in {137, 1} and b"ESCAPED" not in result.stdout


_FORK_BOMB = (
    "import subprocess\nps=[]\ntry:\n    for _ in range(200): ps.append(subprocess.Popen(['sleep','30']))\n"
    "    print('ESCAPED')\nexcept OSError as e:\n    print('EAGAIN' if e.errno==11 else e)\n"
    "finally:\n    [p.kill() for p in ps]"
)


def test_pids_limit_stops_fork_bomb(world: tuple[Machines, MachineInfo, Path]) -> None:
    machines, info, _ = world
    assert _py(machines, info, _FORK_BOMB) == "EAGAIN"


def test_no_orphan_after_delete(world: tuple[Machines, MachineInfo, Path]) -> None:
    machines, _info, _ = world
    other = machines.create("bomb")
    machines.exec(other.id, "setsid sh -c 'sleep 1000 & sleep 1001' >/dev/null 2>&1 &")
    machines.delete(other.id)
    procs = subprocess.run(["ps", "-eo", "args"], capture_output=True, check=True).stdout
    assert b"sleep 1000" not in procs and b"sleep 1001" not in procs


def test_control_plane_database_is_not_visible(
    world: tuple[Machines, MachineInfo, Path], tmp_path: Path
) -> None:
    machines, info, _ = world
    db = tmp_path / "store.db"
    db.write_bytes(b"SQLite format 3\0")
    assert _errno_of(machines, info, f"open({str(db)!r},'rb')") == "ENOENT"


def test_limits_hold_without_a_parked_launcher(tmp_path: Path) -> None:
    """The other way a machine boots: no launcher parked, so it joins its own new cgroups on the way."""
    with Machines(LocalBackend(tmp_path / "run", parked=0)) as machines:
        info = machines.create("cold", limits=Limits(memory_bytes=64 << 20, pids=64))
        assert f"/m/{info.id}" in (info.disk or "")
        result = machines.exec(info.id, ["python3", "-c", "b=bytearray(256<<20);print('ESCAPED')"], timeout=30)
        assert result.exit_code in {137, 1} and b"ESCAPED" not in result.stdout
        assert _py(machines, info, _FORK_BOMB) == "EAGAIN"
