"""``swarmyard run --sandbox ray`` across a two-node Ray cluster, through the console script.

The cluster (a head and a second node process, each with its own ``swarmyard_machines`` resource) and the run
live in a network namespace this test makes, with loopback only: Ray then speaks 127.0.0.1 (it turns a
loopback address into the host's own address when any other route exists), and no packet leaves it.
Asserted: the run completes with its synthesis, its machines ran on both nodes (the audit log's
``machine.created`` events name each machine's node) and bound the plane's own socket there, no machine is left
behind on either node, and the machines API reaches a machine on the second node (exec, files, a streamed exec, a
typed error). Then the second node is made one of "another host" as far as the plane's socket goes (a mount
namespace of its own with an empty tmpfs over the runs folder): its machines reach the plane through its bridge
over the plane's TLS listener, which refuses a client without the run's certificate, and no machine holds any
of the run's certificates or keys.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from rigs.outcomes import assert_simulated_lead_ended

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

SLOTS = 3
#: Runs ``"$@"`` in a loopback-only network namespace with a two-node Ray cluster, then stops the cluster.
CLUSTER = textwrap.dedent(f"""\
    set -e
    ip link set lo up
    export RAY_TMPDIR="$1"; shift
    common="--node-ip-address 127.0.0.1 --num-cpus 1 --resources {{\\"swarmyard_machines\\":{SLOTS}}}"
    common="$common --disable-usage-stats"
    ray start --head --port 56390 --include-dashboard=false --temp-dir "$RAY_TMPDIR" $common >"$RAY_TMPDIR/head.log" 2>&1
    if [ -n "$HIDE_FROM_SECOND" ]; then
        # the second node in a mount namespace of its own, an empty tmpfs over the folder of the run's socket:
        # as far as the plane's socket goes, a node of another host
        unshare --mount sh -c 'mount -t tmpfs -o size=1m apart "$1" && shift && exec ray start "$@"' sh \
            "$HIDE_FROM_SECOND" --address 127.0.0.1:56390 $common >"$RAY_TMPDIR/node.log" 2>&1
    else
        ray start --address 127.0.0.1:56390 $common >"$RAY_TMPDIR/node.log" 2>&1
    fi
    export RAY_ADDRESS=127.0.0.1:56390
    set +e
    "$@"; rc=$?
    # Stop this cluster only: `ray stop` kills every Ray process of the host, another test's cluster too.
    own=$(readlink /proc/self/ns/net)
    for proc in /proc/[0-9]*; do
        pid=${{proc#/proc/}}
        [ "$pid" = "$$" ] && continue
        [ "$(readlink "$proc/ns/net" 2>/dev/null)" = "$own" ] && kill -9 "$pid" 2>/dev/null
    done
    exit $rc
""")


def in_cluster(folder: Path, *argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``argv`` inside a fresh namespace holding a two-node Ray cluster (own user namespace when not root)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.fail("needs unshare and ip (util-linux, iproute2: scripts/test installs them)")
    userns = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    ray_tmp = folder / "ray"
    ray_tmp.mkdir()
    done = subprocess.run(["unshare", *userns, "--net", "sh", "-c", CLUSTER, "cluster", str(ray_tmp), *argv],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:  # say why: the cluster's own start-up lines, then the command's
        logs = "".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(ray_tmp.glob("*.log")))
        done.stderr = f"{logs}--- stderr\n{done.stderr}"
    return done


def _env(folder: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", "HOME": str(folder),
            "LANG": "C.UTF-8"}


def test_a_run_places_its_machines_on_both_nodes(short_tmp: Path) -> None:
    workers = SLOTS + 1  # more than one node takes; with the lead's machine, all fit on the two
    lenses = "".join(f'[[tasks.lenses]]\ntitle = "lens {i}"\nprompt = "Look at lens {i}."\n'
                     for i in range(workers))
    swarm = short_tmp / "swarm.toml"
    swarm.write_text(f"""
[goal]
objective = "Should a small team bet on on-device speech models?"
budget_usd = "1"
call_cap = 200
deadline_s = 600
{lenses}
[policy]
kind = "team"
[workers]
count = {workers}
concurrency = {workers}
exec_timeout_s = 300
max_steps = 1
model = "sim-worker"
[lead]
model = "sim-lead"
[providers.sim]
kind = "simulated"
models = ["sim-worker", "sim-lead"]
[run]
runs_dir = "{short_tmp / 'runs'}"
sandbox = "ray"
""")
    done = in_cluster(short_tmp, sys.executable, "-m", "swarmyard.cli", "run", str(swarm), "--quiet",
                      env=_env(short_tmp))
    # the simulated lead ran on the cluster and ended (its replies are no synthesis: see rigs.outcomes)
    assert_simulated_lead_ended(done.returncode, done.stderr)
    (run_dir,) = (short_tmp / "runs").iterdir()
    with sqlite3.connect(run_dir / "store.db") as db:
        created = [json.loads(body) for (body,) in
                   db.execute("SELECT body FROM events WHERE kind = 'machine.created'")]
        (routes,) = [json.loads(body) for (body,) in
                     db.execute("SELECT body FROM events WHERE kind = 'machines.plane_routes'")]
    assert len(created) >= workers
    nodes = {event["node"] for event in created}
    assert len(nodes) == 2, created  # both the head and the second node ran machines
    # both see the plane's own socket (one host, one mount): both bind it, neither needs a bridge
    assert routes["nodes"] == {node: "socket" for node in nodes}, routes


PROBE = textwrap.dedent("""\
    import json
    from swarmyard.errors import NotFoundError
    from swarmyard.machines import Machines
    from swarmyard.machines.ray import RayBackend

    backend = RayBackend()
    out = {}
    with Machines(backend) as machines:
        ids = [machines.create(f"w{i}").id for i in range(2 * %(slots)d)]
        for machine_id in ids:
            machines.wait_until_ready(machine_id)
        out["per_node"] = sorted(backend.nodes().values())
        last = ids[-1]  # the nodes fill in turn: the last machine is on the node the first is not
        out["two_nodes"] = backend.node_of(ids[0]) != backend.node_of(last)
        result = machines.exec(last, "echo hello; id -u", timeout=30)
        out["exec"] = [result.stdout.decode(), result.exit_code]
        machines.files.upload(last, "note.txt", b"kept")
        out["download"] = machines.files.download(last, "note.txt").decode()
        out["stream"] = [e.kind for e in machines.stream_exec(last, "echo a; echo b >&2", timeout=30)]
        try:
            machines.exec("m_nonesuch", "true")
        except NotFoundError as exc:
            out["missing"] = exc.code
        out["listed"] = len({info.node for info in machines.list()})
    out["after"] = sorted(backend.nodes().values())
    print(json.dumps(out))
""")


def test_the_machines_api_reaches_machines_on_every_node(short_tmp: Path) -> None:
    probe = short_tmp / "probe.py"
    probe.write_text(PROBE % {"slots": SLOTS})
    done = in_cluster(short_tmp, sys.executable, str(probe), env=_env(short_tmp))
    assert done.returncode == 0, done.stderr[-6000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["per_node"] == [SLOTS, SLOTS]
    assert out["two_nodes"] is True
    assert out["exec"] == ["hello\n1000\n", 0]
    assert out["download"] == "kept"
    assert out["stream"] == ["stdout", "stderr", "exit"]
    assert out["missing"] == "not_found"
    assert out["listed"] == 2
    assert out["after"] == [0, 0]  # closing the API deleted every machine on both nodes


APART_PROBE = textwrap.dedent("""\
    import json, socket, sys
    from pathlib import Path
    from swarmyard.machines import Machines
    from swarmyard.machines.ray import RayBackend

    plane = Path(sys.argv[1]) / "plane.sock"  # in the folder the second node cannot see
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(plane))
    listening.listen()
    backend = RayBackend()
    out = {"routes": sorted(backend.plane_routes(plane).values())}
    with Machines(backend) as machines:
        ids = [machines.create(f"w{i}", control_socket=plane).id for i in range(%(slots)d)]
        for machine_id in ids:
            machines.wait_until_ready(machine_id)
        out["per_node"] = sorted(backend.nodes().values())
    print(json.dumps(out))
""")


def test_without_a_bridge_a_node_that_cannot_see_the_plane_socket_gets_no_machine(short_tmp: Path) -> None:
    """Both nodes share a kernel, but the second cannot see the socket (a mount namespace of its own): asked of the
    nodes themselves, it is found apart, and with no bridge given every machine goes to the head."""
    hidden = short_tmp / "hidden"
    hidden.mkdir()
    probe = short_tmp / "probe.py"
    probe.write_text(APART_PROBE % {"slots": SLOTS})
    done = in_cluster(short_tmp, sys.executable, str(probe), str(hidden),
                      env={**_env(short_tmp), "HIDE_FROM_SECOND": str(hidden)})
    assert done.returncode == 0, done.stderr[-6000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["routes"] == ["none", "socket"]
    assert out["per_node"] == [0, SLOTS]  # the nodes alternate when both can take a machine


#: The console script's entry with Ray made unimportable, as on a host without the ray extra.
WITHOUT_RAY = textwrap.dedent("""\
    import importlib.abc, sys
    class NoRay(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "ray" or name.startswith("ray."):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None
    sys.meta_path.insert(0, NoRay())
    from swarmyard.cli.main import main
    main()
""")


@pytest.mark.parametrize("where", ["flag", "file"])
def test_without_the_ray_extra_a_run_stops_with_the_install_hint_before_anything_exists(
        short_tmp: Path, where: str) -> None:
    runs = short_tmp / "runs"
    swarm = short_tmp / "swarm.toml"
    swarm.write_text(f'[goal]\nobjective = "x"\nbudget_usd = "1"\n[[tasks.lenses]]\ntitle = "a"\nprompt = "b"\n'
                     f'[run]\nruns_dir = "{runs}"\n' + ('sandbox = "ray"\n' if where == "file" else ""))
    flags = ["--sandbox", "ray"] if where == "flag" else []
    done = subprocess.run([sys.executable, "-c", WITHOUT_RAY, "run", str(swarm), *flags], cwd=short_tmp,
                          env=_env(short_tmp), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "pip install 'swarmyard[ray]'" in done.stderr
    assert not runs.exists()


#: Inside the cluster's namespace: ``swarmyard run SWARM`` in the background; once its plane says where it listens
#: over TLS, knock with the run's own client certificate (answered), with none and with another CA's (refused),
#: then with the run's again (still answered: the refusals were not the listener closing). Prints what each got.
RUN_AND_KNOCK = textwrap.dedent("""\
    import json, os, socket, sqlite3, ssl, subprocess, sys, time
    from pathlib import Path

    swarm, runs, state, stranger = (Path(a) for a in sys.argv[1:5])
    run = subprocess.Popen([sys.executable, "-m", "swarmyard.cli", "run", str(swarm), "--quiet"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def listening():
        for db in runs.glob("*/store.db"):
            try:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
                    rows = con.execute("SELECT body FROM events WHERE kind = 'plane.tls_listening'").fetchall()
            except sqlite3.Error:
                continue  # being made
            if rows:
                body = json.loads(rows[0][0])
                return db.parent, body.get("data", body)
        return None

    found = None
    while found is None and run.poll() is None:  # bounded by the run: it either listens or ends
        found = listening()
        time.sleep(0.05)
    knocks = {}
    if found is not None:
        run_dir, where = found
        tls = state / "runs" / run_dir.name / "plane-tls"

        def knock(cert):
            context = ssl.create_default_context(cafile=str(tls / "ca.pem"))
            if cert is not None:
                context.load_cert_chain(*cert)
            try:
                with socket.create_connection((where["host"], where["port"]), timeout=60) as raw, \\
                        context.wrap_socket(raw, server_hostname=where["host"]) as conn:
                    conn.sendall(b"GET /healthz HTTP/1.1\\r\\nHost: plane\\r\\nConnection: close\\r\\n\\r\\n")
                    head = conn.recv(12)
                    return "answered" if head.startswith(b"HTTP/1.1") else f"closed {head!r}"
            except (ssl.SSLError, OSError) as exc:
                return f"refused {type(exc).__name__}"

        own = (str(tls / "client.pem"), str(tls / "client.key"))
        knocks = {"own": knock(own), "none": knock(None),
                  "stranger": knock((str(stranger / "client.pem"), str(stranger / "client.key"))),
                  "own_again": knock(own)}
    out, err = run.communicate()
    print(json.dumps({"rc": run.returncode, "stdout": out, "stderr": err[-6000:], "knocks": knocks}))
""")

#: A worker's one command, run in its machine by its interpreter: every regular file of the machine's whole tree
#: that holds a certificate naming swarmyard, or a P-256 private key (what the run's TLS files are), by the first
#: 16 hex digits of its SHA-256; and how many files it read and how many held any PEM block at all.
SCAN = textwrap.dedent(r"""
    import base64, hashlib, json, os, re, stat
    block = re.compile(rb"-----BEGIN ([A-Z ]+)-----([A-Za-z0-9+/=\s]+)-----END \1-----")
    p256 = bytes.fromhex("06082a8648ce3d030107")
    def like_ours(data):
        for kind, body in block.findall(data):
            der = base64.b64decode(b"".join(body.split()) + b"==")
            if (kind == b"CERTIFICATE" and b"swarmyard" in der) or (kind.endswith(b"PRIVATE KEY") and p256 in der):
                return True
        return False
    seen, pem, found = 0, 0, []
    for top, dirs, names in os.walk("/"):
        if top == "/":
            dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
        for name in names:
            path = os.path.join(top, name)
            try:
                info = os.lstat(path)
                if not stat.S_ISREG(info.st_mode) or info.st_size > 262144:
                    continue
                with open(path, "rb") as handle:
                    data = handle.read()
            except OSError:
                continue
            seen += 1
            if b"-----BEGIN" in data:
                pem += 1
                if like_ours(data):
                    found.append(hashlib.sha256(data).hexdigest()[:16])
    print(json.dumps({"seen": seen, "pem": pem, "found": found}))
""")


def test_a_node_that_cannot_see_the_plane_socket_reaches_the_plane_over_mutual_tls(short_tmp: Path) -> None:
    """The second node runs in a mount namespace of its own with an empty tmpfs over the runs folder: it cannot
    see the plane's socket, as a node of another host could not. Its machines reach the plane through its host
    actor's bridge over the plane's TLS listener; a client without the run's certificate is refused there; and no
    machine, on either node, holds any of the run's certificates or keys."""
    workers = SLOTS + 1
    runs = short_tmp / "runs"
    runs.mkdir()
    # each worker's machine holds, as its task's files, a key and a certificate of the same kind as the run's but
    # of another CA: the scan must find those (else it could find nothing), and none of the run's
    files = '["stranger/client.key", "stranger/client.pem"]'
    lenses = "".join(f'[[tasks.lenses]]\ntitle = "lens {i}"\nprompt = "Look at lens {i}."\nfiles = {files}\n'
                     for i in range(workers))
    # one shell call per model call, whichever worker asks: step 1 scans; the last step must submit, which these
    # replies never do, so each worker ends with a partial finding
    scan_command = f"{sys.executable} -I -c '{SCAN}'"
    (short_tmp / "replies.json").write_text(json.dumps(
        {"scripted-worker": [{"tool_calls": [{"name": "shell", "arguments": {"command": scan_command}}]}] * 60}))
    swarm = short_tmp / "swarm.toml"
    swarm.write_text(f"""
[goal]
objective = "Should a small team bet on on-device speech models?"
budget_usd = "1"
call_cap = 200
deadline_s = 900
{lenses}
[policy]
kind = "team"
[workers]
count = {workers}
concurrency = {workers}
exec_timeout_s = 600
max_steps = 2
model = "scripted-worker"
[lead]
model = "sim-lead"
[providers.script]
kind = "scripted"
models = ["scripted-worker"]
replies = "replies.json"
[providers.sim]
kind = "simulated"
models = ["sim-lead"]
[run]
runs_dir = "{runs}"
sandbox = "ray"
""")
    stranger = short_tmp / "stranger"
    made = subprocess.run([sys.executable, "-m", "swarmyard.cli", "certs", "init", "--dir", str(stranger),
                           "--host", "127.0.0.1"], env=_env(short_tmp), capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    knocker = short_tmp / "knock.py"
    knocker.write_text(RUN_AND_KNOCK)
    state = short_tmp / ".local" / "state" / "swarmyard"
    done = in_cluster(short_tmp, sys.executable, str(knocker), str(swarm), str(runs), str(state), str(stranger),
                      env={**_env(short_tmp), "HIDE_FROM_SECOND": str(runs)})
    assert done.returncode == 0, done.stderr[-6000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert_simulated_lead_ended(out["rc"], out["stderr"])
    # the plane's TLS listener answers the run's client certificate and refuses one without it
    knocks = out["knocks"]
    assert knocks["own"] == knocks["own_again"] == "answered", knocks
    assert knocks["none"].startswith(("refused", "closed")), knocks
    assert knocks["stranger"].startswith(("refused", "closed")), knocks

    (run_dir,) = runs.iterdir()
    with sqlite3.connect(run_dir / "store.db") as db:
        def events(kind: str) -> list[dict[str, Any]]:
            bodies = [json.loads(b) for (b,) in db.execute("SELECT body FROM events WHERE kind = ?", (kind,))]
            return [body.get("data", body) for body in bodies]

        created = events("machine.created")
        (routes,) = events("machines.plane_routes")
        (bridged,) = events("machines.bridged")
    node_of = {event["slot"]: event["node"] for event in created}
    assert len(set(node_of.values())) == 2, created  # machines ran on both nodes
    # the head sees the plane's socket and binds it; the second cannot, and got a bridge
    assert sorted(routes["nodes"].values()) == ["bridge", "socket"], routes
    (apart,) = [node for node, route in routes["nodes"].items() if route == "bridge"]
    on_apart = [slot for slot, node in node_of.items() if node == apart]
    assert on_apart, created
    # every connection of the second node's machines went through its bridge, over TLS, and none failed
    assert set(bridged["nodes"]) == {apart}, bridged
    assert bridged["nodes"][apart]["forwarded"] >= len(on_apart) and bridged["nodes"][apart]["failed"] == 0, bridged

    # what each worker's scan found, from its trajectory (which reached the plane through that same way)
    secrets = short_tmp / ".local" / "state" / "swarmyard" / "runs" / run_dir.name / "plane-tls"
    held = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in secrets.iterdir()}
    assert sorted(held) == ["ca.pem", "client.key", "client.pem", "server.key", "server.pem"]  # the CA's key: gone
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in secrets.glob("*.key"))
    scans: dict[str, dict[str, Any]] = {}
    for path in (run_dir / "agents").glob("*.jsonl"):
        slot = next((s for s in node_of if path.name.startswith(f"{s}-")), None)
        for line in path.read_text().splitlines():
            step = json.loads(line)
            if step.get("action", {}).get("tool") == "shell" and slot is not None:
                scans[slot] = json.loads(step["result"].split("\n", 1)[1])
    planted = {hashlib.sha256((stranger / name).read_bytes()).hexdigest()[:16] for name in ("client.key",
                                                                                            "client.pem")}
    # every worker scanned its machine (the lead, on the simulated model, runs no command), workers on both nodes
    scanned = {slot for slot in node_of if slot != "lead"}
    assert set(scans) == scanned and len(scans) == workers, (sorted(scans), sorted(node_of))
    assert {node_of[slot] for slot in scanned} == set(routes["nodes"]), created
    for slot, found in scans.items():
        assert found["seen"] > 100 and found["pem"] >= 2, (slot, found)  # it walked the machine's whole tree
        assert planted <= set(found["found"]), (slot, found)  # it finds files like the run's where they are
        assert not set(found["found"]) & set(held.values()), (slot, node_of[slot], found)
