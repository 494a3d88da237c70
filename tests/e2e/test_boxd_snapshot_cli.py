"""``swarmyard machines snapshot create NAME --from MACHINE`` for a live machine another process made: a user's
Boxd script (``python script.py``) runs a machine and writes a file in it; the command, in a process of its own,
finds the machine by name or id through the machines' records, snapshots its disk (frozen while it is copied)
and leaves it running; a machine created ``from_snapshot=NAME`` sees the file, with the source's disk digest.
An unknown machine is refused (exit 1, ``not_found``) and no version is made, and a version a live machine of
another process runs on is not deleted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.boxd import Boxd

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

_SCRIPT = '''
import json, sys
from swarmyard.boxd import Boxd
with Boxd(providers=sys.argv[1], root=sys.argv[2]) as boxd:
    machine = boxd.machines.create("source")
    boxd.machines.wait_until_ready(machine.id)
    boxd.machines.exec(machine.id, "mkdir -p work && echo 'the checkout' > work/notes.txt")
    print(json.dumps({"id": machine.id, "digest": boxd.machines.disk_digest(machine.id)}), flush=True)
    sys.stdin.readline()  # the test snapshots the machine meanwhile
    print(boxd.machines.exec(machine.id, "cat work/notes.txt", timeout=60).stdout.strip(), flush=True)
'''


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-sc-"))
    (path / "root").mkdir()
    (path / "providers.toml").write_text('[providers.sim]\nkind = "simulated"\nmodels = ["m1"]\n')
    (path / "script.py").write_text(_SCRIPT)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _cli(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    return subprocess.run([sys.executable, "-m", "swarmyard.cli", "machines", "snapshot", *args,
                           "--root", str(folder / "root"), "--json"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=600)


def test_a_live_machine_of_another_process_is_snapshotted_from_the_cli(folder: Path) -> None:
    script = subprocess.Popen([sys.executable, str(folder / "script.py"), str(folder / "providers.toml"),
                               str(folder / "root")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=folder)
    try:
        assert script.stdout is not None and script.stdin is not None
        line = script.stdout.readline()
        assert line, script.stderr.read() if script.stderr else ""
        source = json.loads(line)

        made = _cli(folder, "create", "golden", "--from", "source")
        assert made.returncode == 0, made.stderr
        first = json.loads(made.stdout)[0]
        assert (first["version"], first["digest"]) == (1, source["digest"])
        assert first["source"] == f"machine {source['id']}"
        by_id = _cli(folder, "create", "golden", "--from", source["id"])  # its id names it too
        assert by_id.returncode == 0, by_id.stderr
        assert json.loads(by_id.stdout)[0]["version"] == 2

        unknown = _cli(folder, "create", "golden", "--from", "no-such-machine")
        assert unknown.returncode == 1, unknown.stderr
        assert "(not_found)" in unknown.stderr and "Traceback" not in unknown.stderr
        listed = _cli(folder, "versions", "golden")
        assert [s["version"] for s in json.loads(listed.stdout)] == [1, 2]  # the refusal made no version

        # the source goes on as it was (thawed): its own process still runs commands in it
        script.stdin.write("\n")
        script.stdin.flush()
        assert script.stdout.readline().strip() == "the checkout"
        assert script.wait(120) == 0, script.stderr.read() if script.stderr else ""
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()

    with Boxd(providers=folder / "providers.toml", root=folder / "root") as boxd:
        copy = boxd.machines.create("copy", from_snapshot="golden:1")
        boxd.machines.wait_until_ready(copy.id)
        assert boxd.machines.exec(copy.id, "cat work/notes.txt").stdout.strip() == "the checkout"
        assert boxd.machines.disk_digest(copy.id) == source["digest"]
        # the version this process's machine runs on is not another process's to delete; the other one is
        busy = _cli(folder, "delete", "golden:1")
        assert busy.returncode == 1 and "(conflict)" in busy.stderr, busy.stderr
        assert _cli(folder, "delete", "golden:2").returncode == 0
        assert [s["version"] for s in json.loads(_cli(folder, "versions", "golden").stdout)] == [1]


def test_another_users_machine_is_refused_and_nothing_is_made(folder: Path) -> None:
    # Another user's live machine as its record shows it to this user: this test's own process stands for its
    # owner and its sandbox (both alive), the folder and the record are uid 4242's. The command refuses it.
    started = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[19]
    theirs = folder / "root" / "m" / "m_theirs"
    (theirs / "disk").mkdir(parents=True)
    (theirs / "disk" / "secret.txt").write_text("not yours")
    (theirs / "owner").write_text(f"{os.getpid()} {started}\n")
    (theirs / "machine.json").write_text(json.dumps({
        "id": "m_theirs", "name": "theirs", "uid": 4242, "pid": os.getpid(), "started": started, "through": "host",
        "disk": str(theirs / "disk")}))
    os.chown(theirs, 4242, 4242)
    refused = _cli(folder, "create", "stolen", "--from", "theirs")
    assert refused.returncode == 1, refused.stderr
    assert "(forbidden)" in refused.stderr and "uid 4242" in refused.stderr and "Traceback" not in refused.stderr
    listed = _cli(folder, "list")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
    assert not (folder / "root" / "baselines" / "stolen.v1").exists()
