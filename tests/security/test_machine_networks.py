"""Private networks between machines, on the local backend: who reaches whom, by name and by address.

Four machines on three networks, the seed's shape: a coordinator on every job network and one worker on each.
Every pair is tried both ways by name (``<name>.yard``) and by address; a shared service on one worker's machine
(a small HTTP queue, and PostgreSQL) is used by name from the coordinator and is out of reach, by name and by
address, of a worker on another network. A machine without networks stays isolated; names and flags are
checked before anything is made; the hub namespace and every veth end are gone after ``close``.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.errors import InvalidInputError
from swarmyard.machines import Machines

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

PY = os.path.realpath(sys.executable)
LAYOUT = {"coord": ["job-1", "job-2", "job-3"], "w1": ["job-1"], "w2": ["job-2"], "w3": ["job-3"]}

#: A TCP connect from inside a machine, by name or address: prints one JSON line saying what happened.
CONNECT = textwrap.dedent("""\
    import json, socket, sys
    host, port = sys.argv[1], int(sys.argv[2])
    try:
        socket.create_connection((host, port), timeout=3).close()
        print(json.dumps("ok"))
    except socket.gaierror:
        print(json.dumps("no-name"))
    except OSError as exc:
        print(json.dumps(f"unreachable:{exc.errno}"))
""")

#: A one-file HTTP queue: POST /items appends the body, GET /items pops the oldest (204 when empty).
QUEUE = textwrap.dedent("""\
    import collections, http.server
    items = collections.deque()
    class Queue(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            items.append(self.rfile.read(int(self.headers["content-length"])))
            self.send_response(201); self.end_headers()
        def do_GET(self):
            if not items:
                self.send_response(204); self.end_headers(); return
            body = items.popleft()
            self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass
    http.server.ThreadingHTTPServer(("0.0.0.0", 8080), Queue).serve_forever()
""")


def _root_only() -> None:
    if os.geteuid() != 0:
        pytest.fail("private networks need root; the rootless refusal is tested by "
                    "test_a_rootless_host_refuses_networks_clearly")


@pytest.fixture
def machines(tmp_path: Path) -> Iterator[Machines]:
    _root_only()
    api = Machines("local", root=tmp_path / "machines")
    yield api
    api.close()


def _start(machines: Machines) -> dict[str, str]:
    ids = {name: machines.create(name, networks=nets).id for name, nets in LAYOUT.items()}
    ids["lone"] = machines.create("lone").id
    for machine_id in ids.values():
        machines.wait_until_ready(machine_id)
    for machine_id in ids.values():
        machines.files.upload(machine_id, "connect.py", CONNECT.encode())
    return ids


def _connect(machines: Machines, source: str, host: str, port: int) -> str:
    result = machines.exec(source, [PY, "connect.py", host, str(port)], timeout=30)
    assert result.exit_code == 0, result.stderr.decode()
    outcome: str = json.loads(result.stdout)
    return outcome


def _serve(machines: Machines, machine_id: str, argv: list[str], port: int, peer: str, host: str) -> None:
    """Start a service in the background in ``machine_id``; wait until ``peer`` connects to it (by progress:
    each try is a connect, bounded by a count, not by a clock)."""
    command = " ".join(argv)
    started = machines.exec(machine_id, f"nohup {command} >service.log 2>&1 & echo started", timeout=30)
    assert started.exit_code == 0, started.stderr.decode()
    for _ in range(200):
        if _connect(machines, peer, host, port) == "ok":
            return
    log = machines.files.download(machine_id, "service.log").decode(errors="replace")
    pytest.fail(f"{command} never answered on {host}:{port}: {log[-2000:]}")


def test_reachability_matrix_by_name_and_address(machines: Machines) -> None:
    ids = _start(machines)
    infos = {name: machines.wait_until_ready(machine_id) for name, machine_id in ids.items()}
    addresses = {name: dict(info.addresses) for name, info in infos.items()}
    assert set(addresses["coord"]) == {"job-1", "job-2", "job-3"} and addresses["lone"] == {}
    # each listens on 9000 so that a connect tells "reached" from "refused" and "no route"
    for machine_id in ids.values():
        _serve(machines, machine_id, [PY, "-m", "http.server", "9000", "--bind", "0.0.0.0"], 9000,
               machine_id, "127.0.0.1")
    for source, target in itertools.permutations(LAYOUT, 2):
        shared = set(LAYOUT[source]) & set(LAYOUT[target])
        by_name = _connect(machines, ids[source], f"{target}.yard", 9000)
        if shared:
            assert by_name == "ok", (source, target)
            address = addresses[target][next(iter(shared))]
            assert _connect(machines, ids[source], address, 9000) == "ok", (source, target)
        else:
            assert by_name == "no-name", (source, target)  # no shared network: its name is not there
            for address in addresses[target].values():
                assert _connect(machines, ids[source], address, 9000).startswith("unreachable"), (source, target)
    for target in LAYOUT:  # a machine with no network reaches none, and nobody reaches it
        assert _connect(machines, ids["lone"], f"{target}.yard", 9000) == "no-name"
        for address in addresses[target].values():
            assert _connect(machines, ids["lone"], address, 9000).startswith("unreachable")
    hosts = machines.files.download(ids["w1"], "/etc/hosts").decode()
    assert "coord.yard" in hosts and "w2.yard" not in hosts and "localhost" in hosts


def test_a_shared_queue_and_postgres_are_reached_by_name_only_from_their_network(machines: Machines) -> None:
    ids = _start(machines)
    machines.files.upload(ids["w1"], "queue.py", QUEUE.encode())
    _serve(machines, ids["w1"], [PY, "queue.py"], 8080, ids["coord"], "w1.yard")
    push = machines.exec(ids["coord"], [PY, "-c", "import urllib.request as u; u.urlopen(u.Request("
                                        "'http://w1.yard:8080/items', data=b'job-17', method='POST'), timeout=5)"],
                         timeout=30)
    assert push.exit_code == 0, push.stderr.decode()
    pop = machines.exec(ids["coord"], [PY, "-c", "import urllib.request as u; "
                                       "print(u.urlopen('http://w1.yard:8080/items', timeout=5).read().decode())"],
                        timeout=30)
    assert pop.stdout.decode().strip() == "job-17"
    assert _connect(machines, ids["w2"], "w1.yard", 8080) == "no-name"
    w1_address = dict(machines.wait_until_ready(ids["w1"]).addresses)["job-1"]
    assert _connect(machines, ids["w2"], w1_address, 8080).startswith("unreachable")

    pg_bin = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
    if not pg_bin:
        pytest.fail("needs PostgreSQL's server binaries (scripts/test installs postgresql)")
    bin_dir = pg_bin[-1]
    setup = machines.exec(ids["w1"], f"{bin_dir}/initdb -D pg -U postgres -A trust >initdb.log 2>&1 && "
                          "echo 'host all all 10.231.0.0/16 trust' >> pg/pg_hba.conf", timeout=120)
    assert setup.exit_code == 0, machines.files.download(ids["w1"], "initdb.log").decode()[-2000:]
    _serve(machines, ids["w1"], [f"{bin_dir}/postgres", "-D", "pg", "-c", "listen_addresses=*", "-c",
                                 "unix_socket_directories=/tmp", "-p", "5432"], 5432, ids["coord"], "w1.yard")
    query = machines.exec(ids["coord"], [PY, "-c", "import psycopg; c = psycopg.connect('host=w1.yard port=5432 "
                                         "user=postgres dbname=postgres connect_timeout=5'); "
                                         "print(c.execute('select 6 * 7').fetchone()[0])"], timeout=60)
    assert query.stdout.decode().strip() == "42", query.stderr.decode()[-2000:]
    assert _connect(machines, ids["w2"], "w1.yard", 5432) == "no-name"
    assert _connect(machines, ids["w2"], w1_address, 5432).startswith("unreachable")


def test_names_update_as_machines_come_and_go(machines: Machines) -> None:
    first = machines.create("first", networks=["job-9"]).id
    machines.wait_until_ready(first)
    second = machines.create("second", networks=["job-9"]).id
    machines.wait_until_ready(second)
    assert "second.yard" in machines.files.download(first, "/etc/hosts").decode()
    machines.delete(second)
    assert "second.yard" not in machines.files.download(first, "/etc/hosts").decode()


def test_bad_network_names_are_refused_before_anything_exists(machines: Machines) -> None:
    for bad in (["Job 1"], ["job-1", "job-1"], "job-1", [""], [7], ["a" * 33], ["../x"]):
        with pytest.raises(InvalidInputError) as info:
            machines.create("bad", networks=bad)  # type: ignore[arg-type]
        assert info.value.field == "networks"
    assert machines.list() == []


def test_closing_removes_the_hub_and_every_veth(tmp_path: Path) -> None:
    _root_only()
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    api = Machines("local", root=tmp_path / "machines")
    machine_id = api.create("only", networks=["job-1"]).id
    api.wait_until_ready(machine_id)
    during = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert len(during.splitlines()) == len(before.splitlines()) + 1
    api.close()
    after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert after == before
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True, check=True).stdout
    assert "yard" not in links and "yv" not in links  # nothing leaked into the host's namespace


def test_a_rootless_host_refuses_networks_clearly(tmp_path: Path) -> None:
    """Without root (here: a user namespace with no uid mapped, so the probe is not root), a machine with
    networks is refused with the reason before anything is made; ``swarmyard`` never fakes a network."""
    probe = textwrap.dedent(f"""\
        import json, os
        from pathlib import Path
        from swarmyard.errors import SandboxUnavailableError
        from swarmyard.machines import Isolation, Machines
        assert os.geteuid() != 0
        weak = Isolation(namespaces=False, seccomp=False, landlock=False, cgroups=False, allow_weaker=True)
        with Machines("local", root=Path({str(tmp_path / 'm')!r}), isolation=weak) as machines:
            try:
                machines.create("netted", networks=["job-1"])
                print(json.dumps("made"))
            except SandboxUnavailableError as exc:
                print(json.dumps([exc.message, len(machines.list())]))
    """)
    prefix = ["unshare", "--user"] if os.geteuid() == 0 else []
    done = subprocess.run([*prefix, PY, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    message, left = json.loads(done.stdout.strip().splitlines()[-1])
    assert "need root" in message and left == 0


def test_the_process_backend_refuses_networks(tmp_path: Path) -> None:
    from swarmyard.errors import SandboxUnavailableError

    with Machines("process", root=tmp_path / "m") as machines:
        with pytest.raises(SandboxUnavailableError, match="no private networks"):
            machines.create("netted", networks=["job-1"])
        assert machines.list() == []


def _hubs() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split(" ", 1)[0] for line in listed.splitlines() if line.startswith("swarmyard-")}


def test_the_hub_has_no_address_a_machine_could_reach(machines: Machines) -> None:
    """No IPv4 and no IPv6 (not even link-local) on the hub's bridges and veth ends: its kernel answers nobody."""
    before = _hubs()
    machine_id = machines.create("probe", networks=["job-1"]).id
    machines.wait_until_ready(machine_id)
    (hub,) = _hubs() - before
    for family in ("-4", "-6"):
        shown = subprocess.run(["ip", "-n", hub, family, "-o", "addr", "show"], capture_output=True, text=True,
                               check=True).stdout
        assert [line for line in shown.splitlines() if " lo " not in line] == [], shown


def test_networked_names_are_dns_labels_and_networks_are_bounded(machines: Machines) -> None:
    # "A" and "a" would be one name to the hosts file (lookups ignore case): a networked name is lowercase
    for name in ("Alpha", "a_b", "-x", "x" * 64):
        with pytest.raises(InvalidInputError) as info:
            machines.create(name, networks=["job-1"])
        assert info.value.field == "name"
    with pytest.raises(InvalidInputError) as info:
        machines.create("many", networks=[f"n{i}" for i in range(17)])
    assert info.value.field == "networks"
    assert machines.list() == []
    assert machines.wait_until_ready(machines.create("Alpha").id)  # without networks, names are as before


def test_a_hub_left_by_a_dead_process_is_removed(machines: Machines) -> None:
    dead = next(pid for pid in range(4_000_000, 4_100_000) if not Path(f"/proc/{pid}").exists())
    stale = f"swarmyard-{dead}-leftover"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    try:
        machine_id = machines.create("fresh", networks=["job-1"]).id
        machines.wait_until_ready(machine_id)
        assert stale not in _hubs()
    finally:
        subprocess.run(["ip", "netns", "del", stale], capture_output=True)
