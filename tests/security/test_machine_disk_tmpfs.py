"""The disk quota without root: a tmpfs of the quota's size that bwrap mounts inside the machine.

A process that is not root cannot attach loop devices, so its machines' disks are tmpfs mounts made in their own
user and mount namespaces. These tests select that disk explicitly as root (``LocalBackend(disk="tmpfs")``), and
run the console script on a host whose loop devices are out of reach, where ``auto`` falls back to it:

- a machine writes past its quota and gets ``ENOSPC``; the host's disk under the machine's folder does not grow;
- what the disk holds is counted in the machine's memory limit (a writer past it is killed);
- a baseline is on the disk at boot, a fork starts with its source's files, and neither sees the other's writes;
- a baseline larger than the quota fails the boot with a message that says so;
- ``swarmyard run`` reaches its synthesis with no disk image made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigs.outcomes import assert_simulated_lead_ended
from swarmyard.errors import SandboxError
from swarmyard.machines import Limits, Machines
from swarmyard.machines.local import InitKind, LocalBackend
from swarmyard.machines.protocol import MachineInfo

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

MiB = 1 << 20
CLI = "from swarmyard.cli.main import main; main()"


@pytest.fixture(params=["native", "python"])
def machines(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Machines]:
    """Machines whose disks are tmpfs mounts, on either init, closed (every machine deleted) at the end."""
    init: InitKind = request.param
    found = Machines(LocalBackend(tmp_path / "m", init=init, disk="tmpfs"))
    try:
        yield found
    finally:
        found.close()


def host_bytes(folder: Path) -> int:
    """What the files under ``folder`` occupy on the host's disk (allocated blocks, not apparent sizes)."""
    total = 0
    for parent, dirs, files in os.walk(folder):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_blocks * 512
            except FileNotFoundError:
                continue  # removed while we looked
    return total


def booted(machines: Machines, name: str, disk_bytes: int, baseline: str | None = None) -> MachineInfo:
    info = machines.create(name, limits=Limits(disk_bytes=disk_bytes), baseline=baseline)
    return machines.wait_until_ready(info.id)


def test_a_full_tmpfs_disk_is_enospc_inside_and_costs_the_host_disk_nothing(machines: Machines,
                                                                             tmp_path: Path) -> None:
    quota = 64 * MiB
    info = booted(machines, "filler", quota)
    assert {"disk-quota", "disk-in-memory"} <= set(info.enforced)
    before = host_bytes(tmp_path)
    wrote = machines.exec(info.id, ["dd", "if=/dev/urandom", "of=/machine/fill", "bs=1M", "count=256"], timeout=120)
    assert wrote.exit_code != 0
    assert b"No space left on device" in wrote.stderr
    size = machines.exec(info.id, ["stat", "-c", "%s", "/machine/fill"], timeout=30)
    assert size.ok and 0.9 * quota < int(size.stdout) <= quota
    # The bytes are in the machine's memory, not in any file of the host's.
    grew = host_bytes(tmp_path) - before
    assert grew < MiB, f"the host's disk under the machine grew by {grew} bytes"
    # Full, the machine still runs commands, and freeing space frees it.
    assert machines.exec(info.id, ["rm", "/machine/fill"], timeout=30).ok
    assert machines.exec(info.id, ["sh", "-c", "echo again > /machine/note"], timeout=30).ok
    machines.delete(info.id)


def test_what_a_tmpfs_disk_holds_is_counted_in_the_machines_memory_limit(tmp_path: Path) -> None:
    """A disk larger than the memory limit fills only up to that limit: the memory cgroup's OOM killer ends the
    largest process of the machine, here the writer (the compiled init is small; the Python one can be larger
    than ``dd`` and be the one killed), the file holds less than the limit, and the machine still answers."""
    machines = Machines(LocalBackend(tmp_path / "m", init="native", disk="tmpfs"))
    try:
        limits = Limits(memory_bytes=64 * MiB, disk_bytes=256 * MiB)
        info = machines.wait_until_ready(machines.create("charged", limits=limits).id)
        if "cgroup-memory" not in info.enforced:
            pytest.skip("no memory cgroup on this host to count the disk in")
        wrote = machines.exec(info.id, ["dd", "if=/dev/zero", "of=/machine/fill", "bs=1M", "count=200"],
                              timeout=120)
        assert wrote.exit_code == 128 + 9  # SIGKILL
        size = machines.exec(info.id, ["stat", "-c", "%s", "/machine/fill"], timeout=30)
        assert size.ok and int(size.stdout) < 64 * MiB
        assert machines.exec(info.id, ["rm", "/machine/fill"], timeout=30).ok
    finally:
        machines.close()


def test_baselines_and_forks_carry_their_files_onto_tmpfs_disks(machines: Machines, tmp_path: Path) -> None:
    source = tmp_path / "tree"
    source.mkdir()
    (source / "README").write_text("from the baseline\n")
    machines.prepare_baseline("tree", source)
    first = booted(machines, "first", 32 * MiB, baseline="tree")
    assert machines.exec(first.id, ["cat", "/machine/README"], timeout=30).stdout == b"from the baseline\n"
    assert machines.exec(first.id, ["sh", "-c", "echo mine > /machine/own"], timeout=30).ok
    fork = machines.wait_until_ready(machines.fork(first.id, "fork").id)
    assert {"disk-quota", "disk-in-memory"} <= set(fork.enforced)
    seen = machines.exec(fork.id, ["cat", "/machine/README", "/machine/own"], timeout=30)
    assert seen.stdout == b"from the baseline\nmine\n"
    assert not any(Path(fork.disk or "").iterdir()), "the host still keeps the fork's snapshot"
    # Each disk is its own from then on.
    assert machines.exec(fork.id, ["sh", "-c", "echo fork > /machine/own"], timeout=30).ok
    assert machines.exec(first.id, ["cat", "/machine/own"], timeout=30).stdout == b"mine\n"
    # The machine's disk frozen as a baseline holds what the machine wrote.
    backend = machines.backend
    assert isinstance(backend, LocalBackend)
    backend.baseline_from_machine(fork.id, "forked")
    again = booted(machines, "again", 32 * MiB, baseline="forked")
    assert machines.exec(again.id, ["cat", "/machine/own"], timeout=30).stdout == b"fork\n"


def test_a_baseline_larger_than_the_quota_fails_the_boot_and_says_why(machines: Machines, tmp_path: Path) -> None:
    source = tmp_path / "big"
    source.mkdir()
    with open(source / "blob", "wb") as handle:
        handle.write(os.urandom(24 * MiB))
    machines.prepare_baseline("big", source)
    info = machines.create("small", limits=Limits(disk_bytes=16 * MiB), baseline="big")
    with pytest.raises(SandboxError, match="does its baseline fit in its quota"):
        machines.wait_until_ready(info.id)


SWARM = """\
[goal]
objective = "Should a small team bet on on-device speech models?"
budget_usd = "1"
call_cap = 50
deadline_s = 300

[[tasks.lenses]]
title = "market"
prompt = "Estimate the market."

[policy]
kind = "team"

[workers]
count = 1
concurrency = 1
exec_timeout_s = 120
max_steps = 1
model = "sim-worker"

[lead]
model = "sim-lead"

[providers.sim]
kind = "simulated"
models = ["sim-worker", "sim-lead"]

[run]
runs_dir = "{runs}"
sandbox = "local"
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="hides the loop devices with a bind mount in a mount namespace of its own (needs root)")
def test_a_run_through_the_console_script_without_loop_devices_gets_tmpfs_disks(short_tmp: Path) -> None:
    """The runner, in a mount namespace where ``/dev/loop-control`` is read-only (a container without loop
    devices), takes tmpfs disks: the doctor says so, the run reaches its synthesis, and no disk image is made."""
    swarm = short_tmp / "swarm.toml"
    swarm.write_text(SWARM.format(runs=short_tmp / "runs"))
    blank = short_tmp / "blank"
    blank.touch()
    temp = short_tmp / "t"
    temp.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8",
           "TMPDIR": str(temp)}
    hide = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
            f'mount --bind -o ro "{blank}" /dev/loop-control && exec "$@"', "sh", sys.executable, "-c", CLI]
    doctor = subprocess.run([*hide, "machines", "doctor", "--json"], env=env, capture_output=True, text=True,
                            timeout=120, check=False)
    assert doctor.returncode == 0, doctor.stderr[-3000:]
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["disk quota"]["ok"] and "tmpfs" in checks["disk quota"]["detail"]
    run = subprocess.run([*hide, "run", str(swarm)], env=env, cwd=short_tmp, capture_output=True, text=True,
                         timeout=300, check=False)
    assert_simulated_lead_ended(run.returncode, run.stderr)
    images = temp / f"swarmyard-machines-{os.getuid()}" / "images"
    assert not images.exists(), f"disk images were made: {sorted(p.name for p in images.iterdir())}"


#: Run by a uid that is not root and has no account, with the machines API alone (it needs only the standard
#: library): the code path of an ordinary user, whose disks are tmpfs mounts because loop devices need root.
AS_A_USER = """\
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from swarmyard.machines import Limits, Machines
from swarmyard.machines.local import LocalBackend
backend = LocalBackend(Path(sys.argv[2]) / "m")
machines = Machines(backend)
try:
    limits = Limits(memory_bytes=None, pids=None, disk_bytes=32 << 20)  # this uid has no cgroups of its own
    info = machines.wait_until_ready(machines.create("filler", limits=limits).id)
    fill = machines.exec(info.id, ["dd", "if=/dev/zero", "of=/machine/fill", "bs=1M", "count=64"], timeout=60)
    size = machines.exec(info.id, ["stat", "-c", "%s", "/machine/fill"], timeout=30)
    machines.exec(info.id, ["sh", "-c", "rm /machine/fill; echo mine > /machine/own"], timeout=30)
    fork = machines.wait_until_ready(machines.fork(info.id, "fork", limits=limits).id)
    seen = machines.exec(fork.id, ["cat", "/machine/own"], timeout=30)
    print(json.dumps({"kind": backend.disk_kind, "enforced": list(info.enforced), "stderr": fill.stderr.decode(),
                      "exit": fill.exit_code, "size": int(size.stdout), "fork": seen.stdout.decode()}))
finally:
    machines.close()
"""


def _python_for(uid: int) -> str | None:
    """A Python 3.11 or later that ``uid`` can run (the test's own may live in a folder only root can enter)."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        done = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", candidate, "-I",
                               "-c", "import sys; assert sys.version_info >= (3, 11)"],
                              capture_output=True, check=False, env={"PATH": "/usr/bin:/bin"})
        if done.returncode == 0:
            return candidate
    return None


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="switches to a uid that is not root with setpriv (needs root)")
def test_a_user_that_is_not_root_gets_tmpfs_disks_with_their_quota(short_tmp: Path) -> None:
    uid = next(u for u in range(61_000, 62_000) if not _has_account(u))
    python = _python_for(uid)
    if python is None:
        pytest.skip("no Python 3.11 that a user other than root can run")
    src = str(Path(__import__("swarmyard").__file__).resolve().parent.parent)
    os.chown(short_tmp, uid, uid)
    script = short_tmp / "as_a_user.py"
    script.write_text(AS_A_USER)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(short_tmp), "TMPDIR": str(short_tmp), "LANG": "C.UTF-8"}
    done = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", python, "-I",
                           str(script), src, str(short_tmp)], env=env, cwd=short_tmp, capture_output=True,
                          text=True, timeout=300, check=False)
    if done.returncode != 0 and "Permission denied" in done.stderr and src in done.stderr:
        pytest.skip(f"a user other than root cannot read {src}")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["kind"] == "tmpfs"
    assert "disk-quota" in result["enforced"] and "unmapped-uid" not in result["enforced"]
    assert result["exit"] != 0 and "No space left on device" in result["stderr"]
    assert 0.9 * (32 << 20) < result["size"] <= 32 << 20
    assert result["fork"] == "mine\n"


def _has_account(uid: int) -> bool:
    import pwd

    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True
