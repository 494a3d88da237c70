"""Guarantees of Boxd scripts that a script author, a coordinator machine or a SIGKILL once broke, each through
the doors a user has (a script run as ``python script.py``, the ``swarmyard`` CLI, a coordinator's own ``Boxd()``):

* a snapshot's version that a live machine runs on, named by the snapshot's bare name (as ``workers.baseline =
  "NAME"`` names it), is not deleted under it, neither as ``NAME:VERSION`` nor as ``NAME``;
* the hub namespace of private networks that a killed script left goes at the next client's start, even when that
  client makes no network;
* a coordinator learns nothing of the client's other machines from the names it picks: no machine of the client
  lies in its namespace; a body nested too deep, or a timeout past the clock's range, is a 400, not a 500;
* a machine its client paused while the CLI copied its disk for a snapshot stays paused.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

_PROVIDERS = '[providers.sim]\nkind = "simulated"\nmodels = ["m1"]\n'


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-hg-"))
    (path / "root").mkdir()
    (path / "providers.toml").write_text(_PROVIDERS)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(folder: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}


def _cli(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swarmyard.cli", "machines", "snapshot", *args,
                           "--root", str(folder / "root")],
                          cwd=folder, env=_env(folder), capture_output=True, text=True, timeout=600)


def _script(folder: Path, name: str, text: str) -> subprocess.Popen[str]:
    (folder / name).write_text(text)
    return subprocess.Popen([sys.executable, name, str(folder / "providers.toml"), str(folder / "root")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=folder, env=_env(folder))


_ON_BASELINE = '''
import sys
from swarmyard.boxd import Boxd
with Boxd(providers=sys.argv[1], root=sys.argv[2]) as boxd:
    machine = boxd.machines.create("worker", baseline="golden")  # the bare name, as workers.baseline gives it
    boxd.machines.wait_until_ready(machine.id)
    print("ready", flush=True)
    sys.stdin.readline()  # the test tries to delete the snapshot meanwhile
    print(boxd.machines.exec(machine.id, "cat notes.txt; ls", timeout=60).stdout.replace("\\n", " "), flush=True)
'''


def test_a_version_a_machine_runs_on_by_the_snapshots_name_is_not_deleted(folder: Path) -> None:
    (folder / "seed").mkdir()
    (folder / "seed" / "notes.txt").write_text("from the snapshot\n")
    made = _cli(folder, "create", "golden", "--from", str(folder / "seed"))
    assert made.returncode == 0, made.stderr
    script = _script(folder, "on_baseline.py", _ON_BASELINE)
    try:
        assert script.stdout is not None and script.stdin is not None
        line = script.stdout.readline()
        assert line == "ready\n", script.stderr.read() if script.stderr else ""
        for ref in ("golden:1", "golden"):
            refused = _cli(folder, "delete", ref)
            assert refused.returncode == 1, refused.stdout
            assert "(conflict)" in refused.stderr and "golden:1" in refused.stderr
        versions = _cli(folder, "versions", "golden", "--json")
        assert versions.returncode == 0 and [v["version"] for v in json.loads(versions.stdout)] == [1]
        script.stdin.write("\n")
        script.stdin.flush()
        assert script.stdout.readline().split() == ["from", "the", "snapshot", "notes.txt"]
        assert script.wait(timeout=300) == 0
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
    deleted = _cli(folder, "delete", "golden")  # once the machine is gone
    assert deleted.returncode == 0, deleted.stderr


_ON_A_NETWORK = '''
import sys
from swarmyard.boxd import Boxd
boxd = Boxd(providers=sys.argv[1], root=sys.argv[2])
machine = boxd.machines.create("member", networks=["job-1"])
boxd.machines.wait_until_ready(machine.id)
print("ready", flush=True)
sys.stdin.readline()  # killed here
'''

_WITHOUT_NETWORKS = '''
import sys
from swarmyard.boxd import Boxd
with Boxd(providers=sys.argv[1], root=sys.argv[2]) as boxd:
    machine = boxd.machines.create("plain")
    boxd.machines.wait_until_ready(machine.id)
    print(boxd.machines.exec(machine.id, "echo hi").stdout.strip())
'''


def _hubs_of(pid: int) -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(f"swarmyard-{pid}-")]


@pytest.mark.skipif(os.geteuid() != 0, reason="private networks need root (the product refuses them otherwise)")
def test_the_hub_a_killed_script_left_goes_at_the_next_start_without_networks(folder: Path) -> None:
    script = _script(folder, "on_network.py", _ON_A_NETWORK)
    try:
        assert script.stdout is not None
        assert script.stdout.readline() == "ready\n", script.stderr.read() if script.stderr else ""
        assert len(_hubs_of(script.pid)) == 1  # its hub, with the network's bridge
    finally:
        script.send_signal(signal.SIGKILL)
        script.wait()
    assert len(_hubs_of(script.pid)) == 1  # nothing removed it
    after = subprocess.run([sys.executable, "-c", _WITHOUT_NETWORKS, str(folder / "providers.toml"),
                            str(folder / "root")], cwd=folder, env=_env(folder), capture_output=True, text=True,
                           timeout=300)
    assert after.returncode == 0 and after.stdout.strip() == "hi", after.stderr[-2000:]
    assert _hubs_of(script.pid) == []
    assert list((folder / "root" / "m").iterdir()) == []


_COORDINATOR = '''
import sys
from swarmyard.boxd import Boxd
from swarmyard.errors import SwarmyardError
with Boxd(providers=sys.argv[1], root=sys.argv[2]) as boxd:
    boxd.machines.create("lead.secret")
    for refused in (lambda: boxd.machines.create("lead", spawn=True),):
        try:
            refused()
        except SwarmyardError as exc:
            print("refused:", exc.code, exc.field)
    boss = boxd.machines.create("boss", spawn=True)
    boxd.machines.wait_until_ready(boss.id)
    for refused in (lambda: boxd.machines.create("boss.hidden"), lambda: boxd.machines.fork("boss", "boss.copy")):
        try:
            refused()
        except SwarmyardError as exc:
            print("refused:", exc.code, exc.field)
    boxd.machines.files.upload(boss.id, "inside.py", sys.stdin.read())
    done = boxd.machines.exec(boss.id, "python3 inside.py", timeout=300)
    print(done.stdout, end="")
    print(done.stderr[-2000:], file=sys.stderr)
    print(sorted(m.name for m in boxd.machines.list()))
'''

_INSIDE = '''
import os
import httpx
from swarmyard.boxd import Boxd
boxd = Boxd()
print("made:", boxd.machines.create("hidden").name, boxd.machines.create("secret").name)
deep = httpx.post(os.environ["SWARMYARD_BOXD_URL"] + "/v1/machines", content=b"[" * 100_000,
                  headers={"authorization": "Bearer " + os.environ["SWARMYARD_TOKEN"],
                           "content-type": "application/json"})
print("deep:", deep.status_code, deep.json()["error"]["code"])
for verb, body in (("wait", {"timeout": 1e308}), ("exec", {"command": "true", "timeout": 1e308})):
    huge = httpx.post(os.environ["SWARMYARD_BOXD_URL"] + f"/v1/machines/hidden/{verb}", json=body,
                      headers={"authorization": "Bearer " + os.environ["SWARMYARD_TOKEN"]})
    print(f"{verb} 1e308 s:", huge.status_code, huge.json()["error"]["field"])
'''


def test_a_coordinator_finds_every_name_of_its_own_free(folder: Path) -> None:
    script = _script(folder, "coordinator.py", _COORDINATOR)
    out, err = script.communicate(_INSIDE, timeout=600)
    assert script.returncode == 0, err[-3000:]
    assert out.splitlines() == [
        "refused: invalid_input name",  # a coordinator whose namespace holds lead.secret
        "refused: invalid_input name",  # the client's boss.hidden, in the coordinator boss's namespace
        "refused: invalid_input name",  # a fork named there too
        "made: hidden secret",  # so both names are free to boss: it learns of no machine it may not see
        "deep: 400 nesting_too_deep",
        "wait 1e308 s: 400 timeout",  # an OverflowError, a 500, before
        "exec 1e308 s: 400 timeout",
        "['boss', 'boss.hidden', 'boss.secret', 'lead.secret']",
    ], err[-3000:]


_PAUSED_DURING_A_COPY = '''
import subprocess, sys, time
from swarmyard.boxd import Boxd
with Boxd(providers=sys.argv[1], root=sys.argv[2]) as boxd:
    machine = boxd.machines.create("busy")
    boxd.machines.wait_until_ready(machine.id)
    # many small files: the CLI's copy of the disk lasts long enough to pause the machine in the middle of it
    boxd.machines.files.upload(machine.id, "fill.py", "import os\\nos.makedirs('d')\\n"
                               "for i in range(60000): open(f'd/{i}', 'w').write(str(i))\\n")
    spin = "nohup python3 -c 'while True: pass' >/dev/null 2>&1 & echo $!"
    assert boxd.machines.exec(machine.id, "python3 fill.py", timeout=600).success
    pid = boxd.machines.exec(machine.id, spin, timeout=60).stdout.strip()
    cli = subprocess.Popen([sys.executable, "-m", "swarmyard.cli", "machines", "snapshot", "create", "copy",
                            "--from", "busy", "--root", sys.argv[2]], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    group = boxd._sync.backend._get(machine.id).cgroups
    while not group.frozen and cli.poll() is None:  # until the CLI has frozen it for its copy
        time.sleep(0.01)
    print("frozen by the copy:", group.frozen, flush=True)
    boxd.machines.pause(machine.id)
    _, err = cli.communicate(timeout=600)
    print("copied:", cli.returncode, err.strip()[-300:], flush=True)
    before = boxd.machines.cpu_time_us(machine.id)
    time.sleep(1)  # a spinning process that ran would have used CPU by now
    print("cpu while paused:", boxd.machines.cpu_time_us(machine.id) - before, boxd.machines.get(machine.id).status)
    boxd.machines.resume(machine.id)
    while boxd.machines.cpu_time_us(machine.id) == before:
        time.sleep(0.01)
    same = boxd.machines.exec(machine.id, f"kill -0 {pid} && echo same", timeout=60).stdout.strip()
    print("resumed:", same)
'''


def test_a_machine_paused_while_the_cli_copies_its_disk_stays_paused(folder: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _PAUSED_DURING_A_COPY, str(folder / "providers.toml"),
                           str(folder / "root")], cwd=folder, env=_env(folder), capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "frozen by the copy: True",
        "copied: 0 ",  # the snapshot was made, and left the machine as its owner had it: paused
        "cpu while paused: 0 suspended",
        "resumed: same",
    ], done.stderr[-3000:]
