"""Bounded resources per machine, each tried for real and the host checked afterwards.

- disk: a machine writes past its quota and gets ``ENOSPC``; on the host its disk image holds at most the quota;
- stdout flood: a worker of a real run (the console script) writes 1.5 GB to its stdout; the runner's peak RSS
  stays under 500 MB and the agent log it keeps stays small;
- fork bomb: a machine forks without end against its pids limit; it still answers afterwards, and the host can
  still start processes;
- memory: a machine allocates far past its memory limit and is refused; the host's own processes are untouched.

After each, the machine is deleted and no process is left in its cgroups.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.machines import Limits, Machines
from swarmyard.machines.api import MIN_DISK_BYTES
from swarmyard.machines.local import InitKind, LocalBackend
from swarmyard.machines.protocol import MachineInfo

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

CONSOLE_SCRIPT = Path(sys.executable).with_name("swarmyard")
MiB = 1 << 20


@pytest.fixture
def machines(tmp_path: Path) -> Iterator[Machines]:
    """Machines on a backend of their own, closed (every machine deleted) at the end."""
    found = Machines(LocalBackend(tmp_path / "m"))
    try:
        yield found
    finally:
        found.close()


def machine_processes(info: MachineInfo) -> list[int]:
    """Host processes in the machine's cgroups (named after its folder), as the host's /proc lists them."""
    mark = f"/swarmyard/{Path(info.disk or '').parent.name}"
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if any(line.endswith(mark) for line in (proc / "cgroup").read_text().splitlines()):
                    found.append(int(proc.name))
            except OSError:
                continue  # ended while we looked
    return found


def deleted(machines: Machines, info: MachineInfo) -> None:
    """Delete the machine; before, it had processes on the host (its init at least), after, none is left."""
    assert machine_processes(info), "the check sees no process of a live machine"
    machines.delete(info.id)
    assert machine_processes(info) == []


def attached(image: Path) -> bool:
    """Whether a loop device of the host is backed by ``image`` (the kernel lists each in /sys/block)."""
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            name = backing.read_text().strip().removesuffix(" (deleted)")
        except OSError:
            continue  # detached while we looked
        if name == str(image):
            return True
    return False


def host_can_fork() -> bool:
    """The host can still start a process."""
    return subprocess.run(["true"], check=False).returncode == 0


def booted(machines: Machines, name: str, limits: Limits) -> MachineInfo:
    info = machines.create(name, limits=limits)
    return machines.wait_until_ready(info.id)


@pytest.mark.parametrize("init", ["native", "python"])
def test_a_full_disk_is_enospc_inside_and_costs_the_host_at_most_the_quota(init: InitKind, tmp_path: Path) -> None:
    """With the compiled init the launcher mounts the image in the machine's own mount namespace; with the Python
    init this process mounts it in its own."""
    machines = Machines(LocalBackend(tmp_path / "m", init=init))
    try:
        _fill(machines, tmp_path)
    finally:
        machines.close()


def _fill(machines: Machines, tmp_path: Path) -> None:
    quota = 64 * MiB
    info = booted(machines, "filler", Limits(disk_bytes=quota))
    assert "disk-quota" in info.enforced
    free_before = shutil.disk_usage(tmp_path).free
    wrote = machines.exec(info.id, ["sh", "-c", "dd if=/dev/urandom of=/machine/fill bs=1M count=256"], timeout=120)
    assert wrote.exit_code != 0
    assert b"No space left on device" in wrote.stderr
    # The disk is full inside, not larger than its quota; the machine still runs commands.
    size = machines.exec(info.id, ["stat", "-c", "%s", "/machine/fill"], timeout=30)
    assert size.ok and int(size.stdout) <= quota
    # On the host, the machine's disk is one image file: what it occupies is what the machine took.
    image = Path(info.disk or "").parent / "disk.img"
    taken = os.stat(image).st_blocks * 512
    assert 0.8 * quota < taken <= quota
    drop = free_before - shutil.disk_usage(tmp_path).free
    print(f"disk quota {quota} B: image holds {taken} B; host free space dropped {drop} B during the write")
    assert attached(image)
    deleted(machines, info)
    assert not image.exists()
    # Its loop device detaches itself once the file system is gone with the machine's last mount of it (the
    # kernel may finish that a moment after the last process exits: waited for, with a deadline).
    deadline = time.monotonic() + 30
    while attached(image):
        assert time.monotonic() < deadline, f"a loop device still holds {image}"
        time.sleep(0.05)


_OWNER = (
    "import sys\n"
    "from pathlib import Path\n"
    "from swarmyard.machines import Limits, Machines\n"
    "from swarmyard.machines.local import LocalBackend\n"
    "machines = Machines(LocalBackend(Path(sys.argv[1]), init=sys.argv[2]))\n"
    "info = machines.wait_until_ready(machines.create('orphan', limits=Limits(disk_bytes=32 << 20)).id)\n"
    "print(Path(info.disk).parent / 'disk.img', flush=True)\n"
    "sys.stdin.read()\n"
)


@pytest.mark.parametrize("init", ["native", "python"])
def test_a_killed_owner_leaves_no_disk_behind(init: InitKind, tmp_path: Path) -> None:
    """The process that made a machine is SIGKILLed: its sandbox dies with it, and the next backend on the same
    folder reaps what is left (with the Python init, the disk's mounts in the host's namespace); the disk image's
    loop device is then detached and the machine's folder gone."""
    root = tmp_path / "m"
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, str(root), init], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    image = Path(owner.stdout.readline().strip())
    assert attached(image)
    owner.kill()
    owner.wait()
    LocalBackend(root, init=init).close()  # reaps machines whose owner died
    deadline = time.monotonic() + 30
    while attached(image):
        assert time.monotonic() < deadline, f"a loop device still holds {image}"
        time.sleep(0.05)
    assert not image.parent.exists()


def test_the_default_disk_is_one_gib(machines: Machines) -> None:
    info = booted(machines, "plain", Limits())
    size = machines.exec(info.id, ["sh", "-c", "stat -f -c '%b %S' /machine"], timeout=30)
    blocks, block_size = (int(v) for v in size.stdout.split())
    assert 0.9 * (1 << 30) < blocks * block_size <= 1 << 30


def test_a_disk_smaller_than_a_file_system_is_refused(machines: Machines) -> None:
    from swarmyard.errors import InvalidInputError

    for bad in (MIN_DISK_BYTES - 1, 0, -1, True, 1.5 * MIN_DISK_BYTES):
        with pytest.raises(InvalidInputError) as raised:
            machines.create("tiny", limits=Limits(disk_bytes=bad))  # type: ignore[arg-type]
        assert raised.value.field == "limits.disk_bytes"
    assert machines.backend.list() == []


def test_a_fork_bomb_stays_inside_its_pids_limit(machines: Machines) -> None:
    info = booted(machines, "bomb", Limits(pids=64))
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = machines.exec(info.id, ["python3", "-c", bomb], timeout=5)
    assert result.timed_out
    # While the limit held, the host could start processes. The timed-out command's tree is killed: its
    # processes leave the machine's groups as they are reaped (waited for, with a deadline, not a fixed sleep).
    assert host_can_fork()
    deadline = time.monotonic() + 60
    while len(machine_processes(info)) > 8:
        assert time.monotonic() < deadline, f"the bomb outlived its exec: {len(machine_processes(info))} left"
        time.sleep(0.05)
    after = machines.exec(info.id, ["echo", "alive"], timeout=30)
    assert after.stdout == b"alive\n"
    deleted(machines, info)
    assert host_can_fork()


def test_memory_past_the_limit_is_refused_and_the_host_keeps_its_own(machines: Machines) -> None:
    info = booted(machines, "hog", Limits(memory_bytes=128 * MiB))
    hog = "b = bytearray(1 << 30)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\nprint('allocated')"
    result = machines.exec(info.id, ["python3", "-c", hog], timeout=60)
    assert result.exit_code != 0 and b"allocated" not in result.stdout
    assert host_can_fork()
    after = machines.exec(info.id, ["echo", "alive"], timeout=30)
    assert after.stdout == b"alive\n"
    deleted(machines, info)


def test_a_flooded_exec_keeps_a_head_and_a_tail(machines: Machines) -> None:
    info = booted(machines, "talker", Limits())
    flood = "head -c 12000000 /dev/zero | tr '\\0' x; echo; echo last-line"
    result = machines.exec(info.id, ["sh", "-c", flood], timeout=60)
    assert result.ok and result.truncated
    assert result.stdout_bytes == 12_000_000 + len("\nlast-line\n")
    assert len(result.stdout) <= 4 * MiB
    assert result.stdout.startswith(b"xxxx") and result.stdout.endswith(b"\nlast-line\n")
    quiet = machines.exec(info.id, ["echo", "hi"], timeout=30)
    assert not quiet.truncated and quiet.stdout == b"hi\n" and quiet.stdout_bytes == 3


FLOOD_BYTES = 1_500_000_000


def flood_swarm(folder: Path) -> Path:
    """A run whose one worker floods its agent's stdout (its parent's descriptor 1) with 1.5 GB."""
    command = f"{{ yes flood | head -c {FLOOD_BYTES}; echo; }} > /proc/$PPID/fd/1; echo flooded"
    replies = {
        "scripted-worker": [
            {"tool_calls": [{"name": "shell", "arguments": {"command": command}}]},
            {"tool_calls": [{"name": "submit_finding", "arguments": {"title": "flood", "body": "flooded"}}]},
        ],
        "scripted-lead": [
            {"tool_calls": [{"name": "submit_finding", "arguments": {"title": "synthesis", "body": "done"}}]},
        ],
    }
    (folder / "replies.json").write_text(json.dumps(replies))
    swarm = folder / "swarm.toml"
    swarm.write_text(f"""
[goal]
objective = "Talk a lot."
budget_usd = "1"
call_cap = 20
deadline_s = 600
[[tasks.lenses]]
title = "talk"
prompt = "Talk."
[policy]
kind = "team"
[workers]
count = 1
concurrency = 1
exec_timeout_s = 400
max_steps = 4
model = "scripted-worker"
[lead]
model = "scripted-lead"
[providers.script]
kind = "scripted"
models = ["scripted-worker", "scripted-lead"]
replies = "{folder / 'replies.json'}"
[run]
runs_dir = "{folder / 'runs'}"
""")
    return swarm


# The runner is started by a small parent that waits for it and reports the peak RSS of everything it waited
# for (the runner, and what the runner itself reaped): the kernel's count, not a sample.
_PEAK = (
    "import resource, subprocess, sys\n"
    "code = subprocess.call(sys.argv[1:])\n"
    "print('PEAK-RSS-KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def test_a_worker_flooding_its_stdout_leaves_the_runner_small() -> None:
    folder = Path(tempfile.mkdtemp(prefix="sy-"))
    try:
        swarm = flood_swarm(folder)
        env = {"PATH": os.environ["PATH"], "HOME": str(folder), "LANG": "C.UTF-8"}
        done = subprocess.run([sys.executable, "-c", _PEAK, str(CONSOLE_SCRIPT), "run", str(swarm), "--quiet"],
                              cwd=folder, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        peak_kib = int(done.stderr.rsplit("PEAK-RSS-KIB", 1)[1].split()[0])
        print(f"runner peak RSS under a {FLOOD_BYTES}-byte flood: {peak_kib / 1024:.0f} MiB")
        assert peak_kib * 1024 < 500 * 1000 * 1000
        (run_dir,) = (folder / "runs").iterdir()
        logs = sorted((run_dir / "agents").glob("*.log"))
        flooded = [p for p in logs if "output cut" in p.read_text(errors="replace")[:2000]]
        assert flooded, [p.name for p in logs]
        assert all(p.stat().st_size < 16 * MiB for p in logs)
        wrote = re.search(r"it wrote (\d+) bytes of stdout", flooded[0].read_text(errors="replace")[:2000])
        assert wrote is not None and int(wrote.group(1)) > FLOOD_BYTES
    finally:
        shutil.rmtree(folder, ignore_errors=True)
