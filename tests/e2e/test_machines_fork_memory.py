"""A fork of a running machine carries its processes and their memory, or says in its result that it kept the disk.

Through the user's door: a ``Boxd`` script in a subprocess starts a machine whose background process holds a value
in memory only (a random token it answers on a loopback port), forks the machine and asks the fork's process for
the value. Where the fork's result says ``fork_memory`` it must answer the source's value; where it says the disk
only, the reason is given and the claim is true: the fork has the source's files but not its process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swarmyard.machines.checkpoint import CRIU_HINT

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

#: The machine's background process: some loaded state and a token held only in memory, answered on a port.
_HOLDER = '''
import os, secrets, socket
state = bytearray(os.urandom(1 << 20)) * 16
token = secrets.token_hex(16)
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", 7357))
server.listen()
with open("/home/boxd/holder.ready", "w") as ready:
    ready.write("listening")  # on the disk: says it is up, not what it holds
while True:
    conn, _ = server.accept()
    conn.sendall(f"{token} {len(state)}".encode())
    conn.close()
'''

#: Asks the machine's holder for its value; prints ``none`` when nothing listens.
_ASK = '''
import socket
try:
    with socket.create_connection(("127.0.0.1", 7357), timeout=5) as conn:
        print(conn.recv(200).decode())
except OSError:
    print("none")
'''

_SCRIPT = '''
import json, sys
from swarmyard.boxd import Boxd

with Boxd(root=sys.argv[1]) as boxd:
    source = boxd.machines.create("source")
    boxd.machines.wait_until_ready(source.id)
    boxd.machines.files.upload(source.id, "/home/boxd/holder.py", sys.argv[2])
    boxd.machines.files.upload(source.id, "/home/boxd/ask.py", sys.argv[3])
    boxd.machines.exec(source.id, "setsid python3 /home/boxd/holder.py </dev/null >/dev/null 2>&1 &")
    # bounded by progress: the holder says it is listening on its disk once it holds its state
    waited = boxd.machines.exec(source.id, "while [ ! -e /home/boxd/holder.ready ]; do sleep 0.05; done",
                                timeout=120)
    assert waited.exit_code == 0, waited
    held = boxd.machines.exec(source.id, ["python3", "/home/boxd/ask.py"]).stdout.strip()
    fork = boxd.machines.fork(source.id, "copy")
    boxd.machines.wait_until_ready(fork.id)
    asked = boxd.machines.exec(fork.id, ["python3", "/home/boxd/ask.py"]).stdout.strip()
    ready = boxd.machines.exec(fork.id, ["cat", "/home/boxd/holder.ready"]).stdout.strip()
    print(json.dumps({"held": held, "asked": asked, "ready_file": ready, "fork_memory": fork.fork_memory,
                      "reason": fork.fork_memory_reason, "source_memory": source.fork_memory}))
'''


def _fork(folder: Path, path: str) -> dict[str, object]:
    (folder / "root").mkdir()
    (folder / "script.py").write_text(_SCRIPT)
    env = {"PATH": path, "HOME": str(folder), "LANG": "C.UTF-8"}
    ran = subprocess.run([sys.executable, "script.py", str(folder / "root"), _HOLDER, _ASK], cwd=folder, env=env,
                         capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0, ran.stderr[-3000:]
    report: dict[str, object] = json.loads(ran.stdout.strip().splitlines()[-1])
    held = str(report["held"])
    assert held != "none" and held.endswith(f" {16 << 20}"), report  # the source's process answers its value
    assert report["source_memory"] is None, report  # a machine that is no fork says nothing of the kind
    assert report["ready_file"] == "listening", report  # either way the fork has the source's disk
    return report


def test_a_fork_carries_the_running_process_with_its_memory_or_says_why_it_kept_the_disk_only(
        short_tmp: Path) -> None:
    report = _fork(short_tmp, os.environ.get("PATH", "/usr/bin:/bin"))
    if report["fork_memory"] is True:
        assert report["asked"] == report["held"], report  # the same process state, token and all
        assert report["reason"] is None, report
    else:
        assert report["fork_memory"] is False, report
        assert isinstance(report["reason"], str) and report["reason"], report
        assert report["asked"] == "none", report  # disk only is the truth: no process came with it


def test_a_fork_where_criu_cannot_be_found_keeps_the_disk_and_says_criu_is_missing(short_tmp: Path) -> None:
    # every folder on the caller's PATH that holds a criu is left out: this host has no CRIU for this client
    folders = [entry for entry in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
               if entry and not os.path.exists(os.path.join(entry, "criu"))]
    report = _fork(short_tmp, os.pathsep.join(folders))
    assert report["fork_memory"] is False, report
    assert report["reason"] == f"CRIU is not installed ({CRIU_HINT})", report
    assert report["asked"] == "none", report


#: A coordinator machine forks a sibling through the machines routes: the remote client's record says the same.
_REMOTE = '''
import json, sys
from swarmyard.boxd import Boxd

inner = """
import json
from swarmyard.boxd import Boxd
boxd = Boxd()
a = boxd.machines.create("sib-a")
boxd.machines.wait_until_ready(a.id)
b = boxd.machines.fork("sib-a", "sib-b")
print(json.dumps([a.fork_memory, b.fork_memory, b.fork_memory_reason]))
"""
with Boxd(root=sys.argv[1]) as boxd:
    lead = boxd.machines.create("lead", spawn=True)
    boxd.machines.wait_until_ready(lead.id)
    boxd.machines.files.upload(lead.id, "/home/boxd/inner.py", inner)
    ran = boxd.machines.exec(lead.id, ["python3", "/home/boxd/inner.py"], timeout=300)
    assert ran.exit_code == 0, ran.stderr
    direct = boxd.machines.fork("lead.sib-a", "again")
    print(json.dumps({"remote": json.loads(ran.stdout), "direct": direct.fork_memory_reason}))
'''


def test_a_coordinators_fork_says_through_the_machines_routes_what_it_kept(short_tmp: Path) -> None:
    (short_tmp / "root").mkdir()
    (short_tmp / "script.py").write_text(_REMOTE)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8"}
    ran = subprocess.run([sys.executable, "script.py", str(short_tmp / "root")], cwd=short_tmp, env=env,
                         capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0, ran.stderr[-3000:]
    report = json.loads(ran.stdout.strip().splitlines()[-1])
    plain, forked, reason = report["remote"]
    assert plain is None, report  # a machine made fresh is no fork
    assert isinstance(forked, bool) and (reason is None) is forked, report  # kept memory, or says why not
    assert reason == report["direct"], report  # the same words through the wire as in the host's client
