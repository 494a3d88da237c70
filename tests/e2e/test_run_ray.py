"""``swarmyard run --sandbox ray`` across a two-node Ray cluster, through the console script.

The cluster (a head and a second node process, each with its own ``swarmyard_machines`` resource) and the run
live in a network namespace this test makes, with loopback only: Ray then speaks 127.0.0.1 (it turns a
loopback address into the host's own address when any other route exists), and no packet leaves it.
Asserted: the run completes with its synthesis, its machines ran on both nodes (the audit log's
``machine.created`` events name each machine's node), no machine is left behind on either node, and the
machines API reaches a machine on the second node (exec, files, a streamed exec, a typed error).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

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
    ray start --address 127.0.0.1:56390 $common >"$RAY_TMPDIR/node.log" 2>&1
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


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-r-"))  # the plane's socket lives in the run folder: keep it short
    yield path
    shutil.rmtree(path, ignore_errors=True)


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
    assert done.returncode == 0, done.stderr[-6000:]
    assert done.stdout.strip() and "(no synthesis was written)" not in done.stdout
    (run_dir,) = (short_tmp / "runs").iterdir()
    with sqlite3.connect(run_dir / "store.db") as db:
        created = [json.loads(body) for (body,) in
                   db.execute("SELECT body FROM events WHERE kind = 'machine.created'")]
    assert len(created) >= workers
    nodes = {event["node"] for event in created}
    assert len(nodes) == 2, created  # both the head and the second node ran machines


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
