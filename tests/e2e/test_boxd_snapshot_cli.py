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
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rigs.cli import CLI, cli_env, run_cli
from rigs.scripted import tool_call
from rigs.swarm_files import scripted_run
from swarmyard.boxd import Boxd
from swarmyard.machines import live
from swarmyard.machines.supervised import default_root

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
def folder(short_tmp: Path) -> Path:
    (short_tmp / "root").mkdir()
    (short_tmp / "providers.toml").write_text('[providers.sim]\nkind = "simulated"\nmodels = ["m1"]\n')
    (short_tmp / "script.py").write_text(_SCRIPT)
    return short_tmp


def _cli(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("machines", "snapshot", *args, "--root", str(folder / "root"), "--json", cwd=folder)


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


def test_a_machine_of_a_running_swarm_is_snapshotted_from_the_cli(folder: Path) -> None:
    # The run's worker writes a file, then waits (bounded) for a file the test leaves in its machine once the
    # snapshot is made; the machines of a run live under the default root, where the command looks without --root.
    name = f"of-a-run-{os.getpid()}"
    wait = ("echo 'made in a run' > notes.txt; i=0; while [ ! -e go ] && [ $i -lt 1200 ]; do sleep 0.05; "
            "i=$((i+1)); done; cat notes.txt")
    replies = {
        "scripted-worker": [tool_call("shell", command=wait),
                            tool_call("submit_finding", title="notes", body="{{last_message}}")],
        "scripted-lead": [tool_call("submit_finding", title="synthesis", body="Done.")],
    }
    swarm = scripted_run(folder, replies, objective="Write notes.", lens=("notes", "Write notes."),
                         workers={"exec_timeout_s": 120, "max_steps": 4})
    env = cli_env(folder)
    root = default_root()
    log = (folder / "run.log").open("w")
    run = subprocess.Popen([sys.executable, "-c", CLI, "run", str(swarm)], cwd=folder, env=env,
                           stdout=log, stderr=log, text=True)
    try:
        found = None
        waited = threading.Event()
        for _ in range(6000):  # the run's worker machine is ready and its file written (bounded by progress)
            found = next((m for m in live.machines(root)
                          if (root / "m").is_dir() and _owned_by(root, m.id, run.pid)
                          and (live.disk_path(m, "/machine") / "notes.txt").exists()), None)
            if found is not None or run.poll() is not None:
                break
            waited.wait(0.05)
        assert found is not None, (folder / "run.log").read_text()[-3000:]
        made = run_cli("machines", "snapshot", "create", name, "--from", found.id, "--json", cwd=folder, env=env)
        assert made.returncode == 0, made.stderr
        assert json.loads(made.stdout)[0]["source"] == f"machine {found.id}"
        assert (root / "baselines" / f"{name}.v1" / "notes.txt").read_text() == "made in a run\n"
        (live.disk_path(found, "/machine") / "go").write_text("")  # the worker goes on
        assert run.wait(600) == 0, (folder / "run.log").read_text()[-3000:]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        log.close()
        run_cli("machines", "snapshot", "delete", name, cwd=folder, env=env, timeout_s=120)


def _owned_by(root: Path, machine_id: str, pid: int) -> bool:
    """Whether the machine's folder names process ``pid`` as its owner."""
    for folder in (root / "m").iterdir():
        try:
            if json.loads((folder / "machine.json").read_text())["id"] == machine_id:
                return (folder / "owner").read_text().split()[0] == str(pid)
        except (OSError, ValueError, KeyError):
            continue
    return False
