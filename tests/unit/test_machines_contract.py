"""The Machines contract, run against every backend: ``local`` (real bubblewrap) and ``process``."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import socket
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.errors import InvalidInputError, MachineRefusedError, NotFoundError, SandboxError
from swarmyard.guest import wire
from swarmyard.machines import AsyncMachines, Limits, Machines, cgroups
from swarmyard.machines.process import ProcessWarning


@pytest.fixture(params=["local", "process"])
def machines(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Machines]:
    """A Machines API over each backend, closed (every machine deleted) after the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProcessWarning)
        api = Machines(request.param, root=tmp_path / "run")
        yield api
        api.close()


def test_create_exec_and_output(machines: Machines) -> None:
    info = machines.create("one")
    result = machines.exec(info.id, "echo out; echo err >&2; exit 3")
    assert (result.stdout, result.stderr, result.exit_code, result.timed_out) == (
        b"out\n",
        b"err\n",
        3,
        False,
    )
    assert result.duration_s > 0
    assert [m.name for m in machines.list()] == ["one"]


def test_env_is_allow_list_plus_caller(machines: Machines, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWARMYARD_SECRET_PROBE", "do-not-leak")
    info = machines.create("env", env={"GREETING": "hi"})
    out = machines.exec(info.id, ["env"], env={"EXTRA": "x"}).stdout.decode()
    assert "GREETING=hi" in out and "EXTRA=x" in out
    assert "do-not-leak" not in out


def test_timeout_kills_the_whole_tree(machines: Machines) -> None:
    info = machines.create("slow")
    tag = f"{300 + os.getpid() % 1000}.{threading.get_ident() % 977}"  # unique: the process backend sees host ps
    result = machines.exec(info.id, f"sleep {tag}1 & (setsid sleep {tag}2 &) ; sleep {tag}3", timeout=0.5)
    assert result.timed_out and result.exit_code == 137
    left = machines.exec(info.id, "ps -eo args").stdout.decode()
    assert f"sleep {tag}" not in left


def test_stream_exec_yields_output_then_exit(machines: Machines) -> None:
    info = machines.create("stream")
    events = list(machines.stream_exec(info.id, "echo a; echo b >&2"))
    assert [e.kind for e in events][-1] == "exit"
    assert b"a\n" in b"".join(e.data for e in events if e.kind == "stdout")
    last = events[-1].result
    assert last is not None and last.exit_code == 0


def test_files_roundtrip_and_missing(machines: Machines) -> None:
    info = machines.create("files")
    machines.files.upload(info.id, "dir/a.bin", bytes(range(256)) * 10)
    assert machines.files.download(info.id, "dir/a.bin") == bytes(range(256)) * 10
    assert machines.exec(info.id, "wc -c < dir/a.bin").stdout.strip() == b"2560"
    with pytest.raises(NotFoundError):  # a file that is not there, as the caller named it: not the host's fault
        machines.files.download(info.id, "nope.txt")


def test_upload_many_writes_every_file_and_raises_a_refusal_after_the_others(machines: Machines) -> None:
    info = machines.create("many")
    big = os.urandom(wire.MAX_FRAME + 1)  # over one frame: sent on its own, beside the others
    files = {f"d{i}/f.txt": f"text {i}".encode() for i in range(6)} | {"empty": b"", "big.bin": big}
    machines.files.upload_many(info.id, files, mode=0o600)
    for path, data in files.items():
        assert machines.files.download(info.id, path) == data
    assert machines.exec(info.id, "stat -c %a d0/f.txt d5/f.txt big.bin").stdout.split() == [b"600"] * 3
    # a path under a regular file is refused by the machine; the files around it are still written
    with pytest.raises(MachineRefusedError):
        machines.files.upload_many(info.id, {"first.txt": b"1", "d0/f.txt/under": b"x", "last.txt": b"2"})
    assert machines.files.download(info.id, "first.txt") == b"1"
    assert machines.files.download(info.id, "last.txt") == b"2"


def test_fork_is_copy_on_write(machines: Machines) -> None:
    source = machines.create("src")
    machines.files.upload(source.id, "state.txt", b"v1")
    fork = machines.fork(source.id, "fork")
    assert machines.files.download(fork.id, "state.txt") == b"v1"
    machines.files.upload(fork.id, "state.txt", b"fork")
    machines.files.upload(source.id, "state.txt", b"v2")
    assert machines.files.download(fork.id, "state.txt") == b"fork"
    assert machines.files.download(source.id, "state.txt") == b"v2"
    machines.delete(source.id)
    assert machines.files.download(fork.id, "state.txt") == b"fork"


def test_baseline_shared_without_copy(machines: Machines, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README").write_text("base")
    machines.prepare_baseline("repo", repo)
    a = machines.create("a", baseline="repo")
    b = machines.create("b", baseline="repo")
    machines.exec(a.id, "echo changed > README")
    assert machines.files.download(b.id, "README") == b"base"
    assert machines.files.download(a.id, "README") == b"changed\n"


def test_delete_leaves_nothing(machines: Machines, tmp_path: Path) -> None:
    info = machines.create("gone")
    machines.exec(info.id, "sleep 300 >/dev/null 2>&1 &")
    disk = Path(info.disk or "")
    machines.delete(info.id)
    assert not disk.exists()
    assert str(tmp_path) not in Path("/proc/self/mounts").read_text()
    assert machines.list() == []
    with pytest.raises(NotFoundError):
        machines.exec(info.id, "true")


def test_bad_input_is_refused_and_changes_nothing(machines: Machines) -> None:
    with pytest.raises(InvalidInputError):
        machines.create("bad name!")
    with pytest.raises(InvalidInputError):
        machines.create("x", env={"BAD=NAME": "1"})
    info = machines.create("ok")
    with pytest.raises(InvalidInputError):
        machines.create("ok")
    with pytest.raises(InvalidInputError):
        machines.exec(info.id, [])
    with pytest.raises(InvalidInputError):
        machines.exec(info.id, "true", timeout=-1)
    assert [m.name for m in machines.list()] == ["ok"]


def test_concurrency_cap_queues(tmp_path: Path) -> None:
    with Machines("local", root=tmp_path / "run", max_concurrent=1, queue_timeout_s=0.2) as machines:
        first = machines.create("first")
        with pytest.raises(SandboxError):
            machines.create("second")
        done = threading.Event()
        result: list[str] = []

        def later() -> None:
            result.append(machines.create("third").name)
            done.set()

        waiter = Machines.__new__(Machines)
        del waiter
        thread = threading.Thread(target=later)
        machines._queue_timeout_s = 30.0  # the queued create waits for the delete below
        thread.start()
        assert not done.is_set()
        machines.delete(first.id)
        thread.join(30)
        assert result == ["third"]


def test_relay_reaches_control_socket(machines: Machines, tmp_path: Path) -> None:
    sock_path = tmp_path / "plane.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock_path))
    server.listen(4)

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nplane")

    threading.Thread(target=answer, daemon=True).start()
    info = machines.create("relay", control_socket=sock_path)
    port = machines.wait_until_ready(info.id).relay_port
    assert port
    script = (
        f"import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:{port}/v1/models')"
        ".read().decode())"
    )
    result = machines.exec(info.id, ["python3", "-c", script], timeout=20)
    assert result.stdout.strip() == b"plane", result.stderr
    server.close()


def test_python_m_swarmyard_runs_inside(machines: Machines) -> None:
    info = machines.create("py")
    result = machines.exec(
        info.id, ["python3", "-c", "import swarmyard.guest.wire as w; print(w.MAX_FRAME)"]
    )
    assert result.stdout.strip() == str(1 << 20).encode(), result.stderr


def test_async_api(machines: Machines) -> None:
    async def run() -> tuple[int, list[str]]:
        api = AsyncMachines(machines)
        info = await api.create("async")
        result = await api.exec(info.id, "echo hi")
        kinds = [event.kind async for event in api.stream_exec(info.id, "echo x")]
        await api.delete(info.id)
        return result.exit_code, kinds

    code, kinds = asyncio.run(run())
    assert code == 0 and kinds == ["stdout", "exit"]


def test_process_backend_warns_loudly(tmp_path: Path) -> None:
    with (
        Machines("process", root=tmp_path / "p") as machines,
        pytest.warns(ProcessWarning, match="NO isolation"),
    ):
        machines.create("dev")
    assert os.environ.get("HOME") != str(tmp_path)


def test_local_python_init_fallback_keeps_isolation(tmp_path: Path) -> None:
    """Without a C compiler the Python init boots local machines: same protocol, same Landlock."""
    from swarmyard.machines.local import LocalBackend

    with Machines(LocalBackend(tmp_path / "run", init="python")) as machines:
        info = machines.wait_until_ready(machines.create("py-init").id)
        assert any(e.startswith("landlock-abi") for e in info.enforced)
        result = machines.exec(info.id, "cat; echo err >&2; touch /dev/shm/evil", stdin=b"in", timeout=20)
        assert (result.stdout, result.exit_code) == (b"in", 1)
        assert b"err" in result.stderr and b"Permission denied" in result.stderr
        init = machines.exec(info.id, "cat /proc/2/cmdline").stdout
        assert b"swarmyard.guest.init" in init


def test_local_boots_the_compiled_init(tmp_path: Path) -> None:
    """The C init serves the same requests: stdin, a missing program, a missing cwd."""
    from swarmyard.machines.local import NATIVE_INIT, LocalBackend

    with Machines(LocalBackend(tmp_path / "run", init="native")) as machines:
        info = machines.create("c-init")
        assert machines.exec(info.id, "cat /proc/2/cmdline").stdout.split(b"\0")[0] == NATIVE_INIT.encode()
        assert machines.exec(info.id, ["cat"], stdin=b"x" * 200_000).stdout == b"x" * 200_000
        with pytest.raises(SandboxError, match="No such file"):
            machines.exec(info.id, ["no-such-program"])
        with pytest.raises(SandboxError, match="No such file"):
            machines.exec(info.id, ["true"], cwd="/nope")


def test_wire_request_roundtrip() -> None:
    from swarmyard.guest import wire

    payload = wire.encode_request(
        "exec", argv=["a", "b c", "ü"], env={"K": "v=1", "E": ""}, cwd="/x", timeout_s=1.5, stdin=b"\0\1"
    )
    assert wire.decode_request(payload) == {
        "op": "exec",
        "argv": ["a", "b c", "ü"],
        "env": {"K": "v=1", "E": ""},
        "cwd": "/x",
        "timeout_s": 1.5,
        "stdin": b"\0\1",
    }


def test_native_init_refuses_a_shared_cache_folder(tmp_path: Path) -> None:
    from swarmyard.machines import native

    shared = tmp_path / "cache"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(SandboxError, match="not a private folder"):
        native.build(shared)


def test_a_machine_whose_owner_was_killed_is_reaped(tmp_path: Path) -> None:
    """SIGKILL leaves no chance to delete; the next backend on the same root unmounts and removes it."""
    import subprocess
    import sys

    root = tmp_path / "run"
    code = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from swarmyard.machines.api import Machines\n"
        f"m = Machines('local', root=Path({str(root)!r}))\n"
        "info = m.create('doomed')\n"
        "m.wait_until_ready(info.id)\n"
        "print(info.id, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    machine_id = done.stdout.strip()
    folder = root / "m" / machine_id
    assert done.returncode == -9 and folder.exists()
    # Folders (and cgroups) of the launchers it had parked for later machines are left behind too (a folder
    # caught before its owner file was written is left alone for a while: it may be another process's, new).
    left = [f.name for f in (root / "m").iterdir() if (f / "owner").exists()]
    with Machines("local", root=root) as machines:
        assert machines.list() == []
    assert not folder.exists()
    assert str(folder) not in Path("/proc/self/mountinfo").read_text()
    hierarchy = cgroups.discover()
    assert not [g for name in left for g in cgroups.group_folders(hierarchy, name) if g.exists()]


def _our_parked_launchers() -> dict[int, list[str]]:
    """This process's parked launchers (pid -> the cgroup.procs files it joined), found in /proc."""
    found: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = argv[1:2] == [b"--park"] and b"--parent" in argv[:-1]
        if ours and argv[argv.index(b"--parent") + 1] == str(os.getpid()).encode():
            found[int(entry.name)] = [a.decode() for a in argv if a.endswith(b"cgroup.procs")]
    return found


def test_parked_launchers_give_each_machine_its_own_limits(tmp_path: Path) -> None:
    """Launchers wait in groups holding the default limits; each machine gets exactly the limits it asked for."""
    from swarmyard.machines.local import LocalBackend

    backend = LocalBackend(tmp_path / "run", parked=3)
    backend.park()
    assert _our_parked_launchers()
    with Machines(backend) as machines:
        small = machines.create("small", limits=Limits(memory_bytes=96 << 20, pids=32))
        free = machines.create("free", limits=Limits(memory_bytes=None, pids=None))
        plain = machines.create("plain")
        for info in (small, free, plain):
            assert "/m/slot_" in (info.disk or "")  # each was booted by a parked launcher
        assert "cgroup-memory" in machines.wait_until_ready(small.id).enforced
        assert not {"cgroup-memory", "cgroup-pids"} & set(machines.wait_until_ready(free.id).enforced)
        assert {"cgroup-memory", "cgroup-pids"} <= set(machines.wait_until_ready(plain.id).enforced)
        grab = "python3 -c 'b=bytearray(200<<20);print(len(b))'"
        assert machines.exec(small.id, grab, timeout=30).exit_code in {137, 1}
        assert machines.exec(free.id, grab, timeout=30).stdout.strip() == str(200 << 20).encode()
        # A launcher parked with an empty disk mounted boots a baseline's disk or a fork's just the same.
        backend.park()
        repo = tmp_path / "repo"
        repo.mkdir()
        (repo / "README").write_text("base")
        machines.prepare_baseline("repo", repo)
        based = machines.create("based", baseline="repo")
        assert "/m/slot_" in (based.disk or "")
        machines.exec(based.id, "echo mine > own")
        child = machines.fork(based.id, "child")
        assert "/m/slot_" in (child.disk or "")
        assert machines.exec(child.id, "cat README own").stdout == b"basemine\n"
        assert machines.exec(plain.id, "ls").stdout == b""
    # close() stops the launchers parked since and removes their cgroups
    assert _our_parked_launchers() == {}


def test_a_parked_launcher_killed_while_waiting_is_replaced(tmp_path: Path) -> None:
    from swarmyard.machines.local import LocalBackend

    backend = LocalBackend(tmp_path / "run", parked=2)
    backend.park()
    parked = _our_parked_launchers()
    for pid in parked:
        pidfd = os.pidfd_open(pid)
        os.kill(pid, signal.SIGKILL)
        select.select([pidfd], [], [], 10)  # readable once it has exited
        os.close(pidfd)
    with Machines(backend) as machines:
        info = machines.create("after", limits=Limits(memory_bytes=96 << 20, pids=32))
        assert machines.exec(info.id, "echo ok").stdout == b"ok\n"
        assert {"cgroup-memory", "cgroup-pids"} <= set(machines.wait_until_ready(info.id).enforced)
    joined = [Path(p).parent for files in parked.values() for p in files]
    assert joined and not [g for g in joined if g.exists()]


def test_a_machine_disk_becomes_a_baseline(tmp_path: Path) -> None:
    """The disk is mounted in the machine's own mount namespace (not the host's); freezing it still works."""
    from swarmyard.machines.local import LocalBackend

    backend = LocalBackend(tmp_path / "run")
    with Machines(backend) as machines:
        source = machines.create("source")
        machines.exec(source.id, "mkdir -p repo && echo hi > repo/f")
        assert not Path(source.disk or "").is_mount()
        backend.baseline_from_machine(source.id, "snap")
        child = machines.create("child", baseline="snap")
        assert machines.exec(child.id, "cat repo/f").stdout == b"hi\n"
