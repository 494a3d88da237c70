"""``swarmyard machines new|exec|list|fork|delete|stop`` through the console script, on the host and inside a
coordinator machine, with real sandboxes on real private networks.

On the host the first ``new`` starts the root's machines service in the background; every later command reaches it.
Machines on a shared network reach each other by ``<name>.boxd`` (and ``<name>.yard``); a machine on another
network neither resolves nor reaches them, by name or by address. Inside a coordinator machine (``--spawn``) the same
commands make its own machines, in its namespace, on its networks only, and see none of the host's others.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

SWARMYARD = Path(sys.executable).parent / "swarmyard"

#: Starts an HTTP server on 8080 serving the machine's home and returns once it listens (the server forks off,
#: its output away from the exec's pipes), so a peer's request after this exec needs no retry.
SERVE = textwrap.dedent("""\
    import http.server, os, sys
    server = http.server.ThreadingHTTPServer(("0.0.0.0", 8080), http.server.SimpleHTTPRequestHandler)
    if os.fork():
        print("listening")
        sys.exit(0)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    server.serve_forever()
""")


@pytest.fixture
def root() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.fail("private networks need root (see tests/security/test_machine_networks.py)")
    path = Path(tempfile.mkdtemp(prefix="sy-mc-"))  # the service's socket lives under it: keep it short
    before = _netns()
    yield path
    stopped = sy(path, "machines", "stop")
    shutil.rmtree(path, ignore_errors=True)
    assert stopped.returncode == 0, stopped.stderr
    assert _netns() == before  # the service's network hub went with it


def _netns() -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return sorted(line.split(" ", 1)[0] for line in listed.splitlines())


def sy(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The console script on the host, this test's machines root named on every command."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root), "LANG": "C.UTF-8",
           "TMPDIR": tempfile.gettempdir()}
    noun, verb, *rest = args
    return subprocess.run([str(SWARMYARD), noun, verb, "--root", str(root), *rest], env=env, capture_output=True,
                          text=True, timeout=600, check=False)


def new(root: Path, name: str, *flags: str) -> dict[str, Any]:
    made = sy(root, "machines", "new", name, *flags, "--json")
    assert made.returncode == 0, made.stderr
    record: dict[str, Any] = json.loads(made.stdout)[0]
    assert record["name"] == name and record["status"] == "running"
    return record


def run_in(root: Path, machine: str, *command: str) -> subprocess.CompletedProcess[str]:
    return sy(root, "machines", "exec", machine, "--", *command)


def test_the_cli_isolates_networks_as_the_client_does_and_boxd_names_resolve(root: Path) -> None:
    coordinator = new(root, "coordinator", "--networks", "job-1", "--isolated")
    new(root, "worker", "--networks", "job-1")
    new(root, "outsider", "--networks", "job-2")
    new(root, "lone")  # no network at all
    assert set(coordinator["networks"]) == {"job-1"}
    address = coordinator["networks"]["job-1"]

    wrote = run_in(root, "coordinator", "echo from-the-coordinator > token.txt")
    assert wrote.returncode == 0, wrote.stderr
    started = run_in(root, "coordinator", "python3", "-c", SERVE)
    assert started.returncode == 0 and started.stdout.strip() == "listening", started.stderr

    for name in ("coordinator.boxd", "coordinator.yard", address):
        fetched = run_in(root, "worker", "curl", "-sS", "-m", "10", f"http://{name}:8080/token.txt")
        assert fetched.returncode == 0, (name, fetched.stderr)
        assert fetched.stdout.strip() == "from-the-coordinator"

    unresolved = run_in(root, "outsider", "curl", "-sS", "-m", "10", "http://coordinator.boxd:8080/token.txt")
    assert unresolved.returncode == 6 and "resolve" in unresolved.stderr  # curl: could not resolve host
    for machine in ("outsider", "lone"):
        unreached = run_in(root, machine, "curl", "-sS", "-m", "10", f"http://{address}:8080/token.txt")
        assert unreached.returncode in (7, 28), (machine, unreached.stderr)  # no connection, or none in time
        assert "from-the-coordinator" not in unreached.stdout
    # nor does an isolated machine reach a server on the host's loopback: its 127.0.0.1 is its own
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler) as host_server:
        threading.Thread(target=host_server.serve_forever, daemon=True).start()
        port = host_server.server_address[1]
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).status == 200  # it does answer
        for machine in ("worker", "lone"):
            local = run_in(root, machine, "curl", "-sS", "-m", "10", f"http://127.0.0.1:{port}/")
            assert local.returncode in (7, 28), (machine, local.stderr)
        host_server.shutdown()
    # the command's own exit code is the command's: false exits 1 in there, and so does exec
    assert run_in(root, "worker", "false").returncode == 1

    listed = sy(root, "machines", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(m["name"] for m in json.loads(listed.stdout)) == ["coordinator", "lone", "outsider", "worker"]

    forked = sy(root, "machines", "fork", "coordinator", "copy", "--json")
    assert forked.returncode == 0, forked.stderr
    copied = run_in(root, "copy", "cat", "token.txt")
    assert copied.returncode == 0 and copied.stdout.strip() == "from-the-coordinator", copied.stderr

    for name in ("worker", "copy"):
        deleted = sy(root, "machines", "delete", name)
        assert deleted.returncode == 0, deleted.stderr
    gone = run_in(root, "worker", "true")
    assert gone.returncode == 1 and "not_found" in gone.stderr
    listed = sy(root, "machines", "list", "--json")
    assert sorted(m["name"] for m in json.loads(listed.stdout)) == ["coordinator", "lone", "outsider"]


def test_inside_a_coordinator_the_cli_makes_its_own_machines_on_its_own_networks(root: Path) -> None:
    new(root, "coord", "--spawn", "--networks", "job-1")
    new(root, "neighbour", "--networks", "job-1")  # the host's, on the coordinator's network
    new(root, "elsewhere", "--networks", "job-2")

    inside = run_in(root, "coord", textwrap.dedent("""\
        set -e
        swarmyard machines new w1 --networks job-1 --json
        swarmyard machines list --json
        swarmyard machines exec w1 -- cat /etc/hosts
    """))
    assert inside.returncode == 0, inside.stderr
    decoder = json.JSONDecoder()
    made, at = decoder.raw_decode(inside.stdout)
    listed, end = decoder.raw_decode(inside.stdout, at + 1)
    hosts = inside.stdout[end:]
    assert made[0]["name"] == "w1" and set(made[0]["networks"]) == {"job-1"}
    assert [m["name"] for m in listed] == ["w1"]  # its own only: not the host's neighbour, elsewhere, nor itself
    assert "coord.boxd" in hosts and "w1.boxd" in hosts and "neighbour.boxd" in hosts
    assert "elsewhere" not in hosts

    # w1 reaches its coordinator by name
    served = run_in(root, "coord", "python3", "-c", SERVE)
    assert served.returncode == 0, served.stderr
    reached = run_in(root, "coord", "swarmyard machines exec w1 -- curl -sS -m 10 -o /dev/null -w '%{http_code}' "
                                    "http://coord.boxd:8080/")
    assert reached.returncode == 0 and reached.stdout == "200", reached.stderr

    # the rules of the client: a network it is not on, a host machine, spawn from a child: all refused
    foreign = run_in(root, "coord", "swarmyard machines new w2 --networks job-2")
    assert foreign.returncode == 1 and "forbidden" in foreign.stderr
    hidden = run_in(root, "coord", "swarmyard machines exec elsewhere -- true")
    assert hidden.returncode == 1 and "not_found" in hidden.stderr
    nested = run_in(root, "coord", "swarmyard machines new w3 --spawn")
    assert nested.returncode == 1 and "spawn" in nested.stderr
    child = run_in(root, "coord", "swarmyard machines exec w1 -- swarmyard machines new w4")
    assert child.returncode == 1 and "no spawn capability" in child.stderr

    on_host = sy(root, "machines", "list", "--json")
    assert sorted(m["name"] for m in json.loads(on_host.stdout)) == ["coord", "coord.w1", "elsewhere", "neighbour"]
    deleted = sy(root, "machines", "delete", "coord")  # what a coordinator made goes with it
    assert deleted.returncode == 0, deleted.stderr
    on_host = sy(root, "machines", "list", "--json")
    assert sorted(m["name"] for m in json.loads(on_host.stdout)) == ["elsewhere", "neighbour"]


def test_without_a_service_there_is_no_machine_and_commands_say_so(root: Path) -> None:
    listed = sy(root, "machines", "list", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
    missing = run_in(root, "nobody", "true")
    assert missing.returncode == 1 and "machines new" in missing.stderr
    bad = sy(root, "machines", "new", "Bad_Name", "--networks", "job-1")
    assert bad.returncode == 1 and "invalid_input" in bad.stderr
    listed = sy(root, "machines", "list", "--json")
    assert json.loads(listed.stdout) == []


def test_a_service_started_by_hand_keeps_its_caps_for_every_command(root: Path) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root), "LANG": "C.UTF-8",
           "TMPDIR": tempfile.gettempdir()}
    service = subprocess.Popen([str(SWARMYARD), "machines", "serve", "--root", str(root), "--spawn-cap", "1"],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        new(root, "coord", "--spawn")  # finds the service starting (or started), and starts no other
        inside = run_in(root, "coord", "swarmyard machines new w1 && swarmyard machines new w2")
        assert inside.returncode == 1 and "spawn cap" in inside.stderr, inside.stderr
        listed = sy(root, "machines", "list", "--json")
        assert sorted(m["name"] for m in json.loads(listed.stdout)) == ["coord", "coord.w1"]
        stopped = sy(root, "machines", "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert service.wait(timeout=120) == 0, service.stderr.read() if service.stderr else ""
    finally:
        if service.poll() is None:
            service.kill()
            service.wait()
    listed = sy(root, "machines", "list", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
