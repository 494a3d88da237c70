"""What a machine, or a coordinator machine's own script, may not do to the client that made it: each test runs a
user's script with ``python script.py`` (the simulated provider; no model) and reads what it printed.

A download is a regular file of at most 64 MiB (a symlink to ``/dev/zero`` or a FIFO is refused in the machine,
a larger file on the host); a coordinator's request body is capped before it is read; its spawn cap holds against
concurrent creates; a create still under way when its coordinator is deleted leaves no machine; deleting one of
its children from outside leaves the others usable.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

_HEAD = '''
import json, sys
from swarmyard.boxd import Boxd
from swarmyard.errors import SwarmyardError
PROVIDERS = sys.argv[1]
INSIDE = open(sys.argv[2]).read()  # the program a coordinator machine runs, if the test has one

def outcome(call):
    try:
        value = call()
    except SwarmyardError as exc:
        return type(exc).__name__
    except Exception as exc:
        return "UNTYPED " + type(exc).__name__ + ": " + str(exc)
    return "ok" if value is None or not isinstance(value, (str, bytes, int)) else "ok " + str(len(value) if isinstance(value, bytes) else value)
'''


def _run(tmp_path: Path, body: str, inside: str = "") -> dict[str, object]:
    (tmp_path / "providers.toml").write_text('[providers.sim]\nkind = "simulated"\nmodels = ["m1"]\n')
    (tmp_path / "inside.py").write_text(inside)
    script = tmp_path / "script.py"
    script.write_text(_HEAD + textwrap.dedent(body))
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "providers.toml"), str(tmp_path / "inside.py")],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    answer: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


# a body that says it is 1 TiB long: answered 413 on its length, not read until the peer gives up
_OVERSIZED = """import http.client, os, urllib.parse
url = urllib.parse.urlsplit(os.environ["SWARMYARD_BOXD_URL"])
conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
conn.putrequest("POST", "/v1/machines")
conn.putheader("authorization", "Bearer " + os.environ["SWARMYARD_TOKEN"])
conn.putheader("content-length", str(1 << 40))
conn.endheaders()
conn.send(b"{")
print(conn.getresponse().status)
"""

# six creates at once against a spawn cap of two
_RACE = """import json, os, threading, urllib.request
url, token = os.environ["SWARMYARD_BOXD_URL"], os.environ["SWARMYARD_TOKEN"]
def make(i):
    request = urllib.request.Request(url + "/v1/machines", data=json.dumps({"name": f"kid{i}"}).encode(),
                                     method="POST", headers={"authorization": "Bearer " + token})
    try:
        urllib.request.urlopen(request, timeout=120)
    except Exception:
        pass
threads = [threading.Thread(target=make, args=(i,)) for i in range(6)]
[t.start() for t in threads]
[t.join() for t in threads]
"""


def test_a_download_is_a_regular_file_of_bounded_size(tmp_path: Path) -> None:
    got = _run(tmp_path, '''
        with Boxd(providers=PROVIDERS) as b:
            b.machines.create("m"); b.machines.wait_until_ready("m")
            b.machines.exec("m", "ln -s /dev/zero zero && mkfifo pipe && truncate -s 65M big && "
                                 "truncate -s 64M fits")
            print(json.dumps({p: outcome(lambda: b.machines.files.download("m", p))
                              for p in ("zero", "pipe", "big", "fits")}))
    ''')
    assert got == {"zero": "MachineRefusedError", "pipe": "MachineRefusedError", "big": "PayloadTooLargeError",
                   "fits": f"ok {64 << 20}"}


def test_a_coordinator_body_over_the_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    got = _run(tmp_path, '''
        with Boxd(providers=PROVIDERS) as b:
            b.machines.create("coord", spawn=True); b.machines.wait_until_ready("coord")
            done = b.machines.exec("coord", ["python3", "-c", INSIDE], timeout=120)
            print(json.dumps({"status": done.stdout.strip(), "stderr": done.stderr[-500:]}))
    ''', _OVERSIZED)
    assert got["status"] == "413", got


def test_the_spawn_cap_holds_against_concurrent_creates(tmp_path: Path) -> None:
    got = _run(tmp_path, '''
        with Boxd(providers=PROVIDERS, spawn_cap=2) as b:
            b.machines.create("coord", spawn=True); b.machines.wait_until_ready("coord")
            done = b.machines.exec("coord", ["python3", "-c", INSIDE], timeout=300)
            print(json.dumps({"kids": sorted(m.name for m in b.machines.list() if m.name != "coord"),
                              "ok": done.success}))
    ''', _RACE)
    assert got["ok"] is True and len(got["kids"]) == 2, got  # type: ignore[arg-type]


def test_a_create_under_way_when_its_coordinator_is_deleted_leaves_no_machine(tmp_path: Path) -> None:
    # Two machine slots: the coordinator and a filler hold them, so the coordinator's create waits for one; the
    # coordinator's deletion frees one and the create goes on, for a machine whose coordinator is gone.
    got = _run(tmp_path, '''
        import threading, time
        with Boxd(providers=PROVIDERS, max_machines=2) as b:
            b.machines.create("coord", spawn=True); b.machines.wait_until_ready("coord")
            b.machines.create("filler"); b.machines.wait_until_ready("filler")
            make = "from swarmyard.boxd import Boxd; Boxd().machines.create('orphan')"
            asked = threading.Thread(target=lambda: outcome(lambda: b.machines.exec(
                "coord", ["python3", "-c", make], timeout=300)))
            asked.start()
            names = b._sync._names  # the names a create has claimed, waiting for a slot or not
            while "coord.orphan" not in names:  # a coordinator's machines are named in its namespace
                time.sleep(0.05)
            b.machines.delete("coord")
            asked.join()
            # the queued create runs, finds its coordinator gone and deletes its machine, which frees the name (a
            # bound only so that a build where the machine stays fails instead of waiting for ever)
            deadline = time.monotonic() + 120
            while "coord.orphan" in names and time.monotonic() < deadline:
                time.sleep(0.05)
            print(json.dumps({"left": sorted(m.name for m in b.machines.list())}))
    ''')
    assert got == {"left": ["filler"]}


def test_a_child_deleted_from_outside_leaves_its_coordinator_working(tmp_path: Path) -> None:
    got = _run(tmp_path, '''
        make = "from swarmyard.boxd import Boxd; x = Boxd(); x.machines.create('kid0'); x.machines.create('kid1')"
        use = ("from swarmyard.boxd import Boxd; x = Boxd(); x.machines.wait_until_ready('kid1'); "
               "print([m.name for m in x.machines.list()], x.machines.exec('kid1', 'echo hi').stdout.strip())")
        with Boxd(providers=PROVIDERS) as b:
            b.machines.create("coord", spawn=True); b.machines.wait_until_ready("coord")
            b.machines.exec("coord", ["python3", "-c", make], timeout=120)
            b.machines.delete("coord.kid0")
            done = b.machines.exec("coord", ["python3", "-c", use], timeout=120)
            print(json.dumps({"out": done.stdout.strip(), "err": done.stderr[-800:]}))
    ''')
    assert got["out"] == "['kid1'] hi", got


def test_bad_arguments_are_typed_errors(tmp_path: Path) -> None:
    got = _run(tmp_path, '''
        with Boxd(providers=PROVIDERS) as b:
            b.machines.create("e"); b.machines.wait_until_ready("e")
            x = b.machines
            calls = {
                "timeout nan": lambda: x.exec("e", "true", timeout=float("nan")),
                "timeout inf": lambda: x.exec("e", "true", timeout=float("inf")),
                "timeout True": lambda: x.exec("e", "true", timeout=True),
                "command 5": lambda: x.exec("e", 5),
                "stdin 5": lambda: x.exec("e", "cat", stdin=5),
                "NUL": lambda: x.exec("e", "echo a\\0b"),
                "NUL in argv": lambda: x.exec("e", ["echo", "a\\0b"]),
                "wait nan": lambda: x.wait_until_ready("e", timeout=float("nan")),
                "mode -1": lambda: x.files.upload("e", "f", "x", mode=-1),
                "mode str": lambda: x.files.upload("e", "f", "x", mode="777"),
            }
            print(json.dumps({k: outcome(v) for k, v in calls.items()}))
    ''')
    assert got == {k: "InvalidInputError" for k in got} and len(got) == 10, got


def test_the_disk_digest_is_not_the_machines_to_forge(tmp_path: Path) -> None:
    got = _run(tmp_path, '''
        plant = ("mkdir -p swarmyard/machines .local/lib/python3.11/site-packages && "
                 "echo 'print(\\"forged\\"); raise SystemExit' > swarmyard/__init__.py && "
                 "cp swarmyard/__init__.py swarmyard/machines/__init__.py && "
                 "echo 'import sys; print(\\"forged\\"); sys.exit()' > .local/lib/python3.11/site-packages/x.pth")
        with Boxd(providers=PROVIDERS) as b:
            b.machines.create("d"); b.machines.wait_until_ready("d")
            b.machines.exec("d", plant)
            print(json.dumps({"digest": b.machines.disk_digest("d")}))
    ''')
    digest = str(got["digest"])
    assert len(digest) == 64 and int(digest, 16) >= 0, got


def test_machines_give_their_envelope_back_and_failed_creates_spend_nothing(tmp_path: Path) -> None:
    # $3 with $1 a machine: ever more than three machines in a row, made and deleted or refused, fit in it
    got = _run(tmp_path, '''
        from swarmyard.plane.client import PlaneAddress
        with Boxd(providers=PROVIDERS, budget_usd="3", machine_budget_usd="1") as b:
            refused = [outcome(lambda: b.machines.create("bad/name")) for _ in range(4)]
            made = []
            for i in range(5):
                b.machines.create(f"c{i}"); b.machines.wait_until_ready(f"c{i}")
                b.machines.exec(f"c{i}", "true")
                b.machines.delete(f"c{i}")
                made.append(f"c{i}")
            three = [b.machines.create(f"k{i}").name for i in range(3)]
            fourth = outcome(lambda: b.machines.create("k3"))
            plane = b._plane
            goal = plane._call("GET", f"/v1/operator/goals/{plane.goal_id}")["goal"]
            print(json.dumps({"refused": refused, "made": made, "three": three, "fourth": fourth,
                              "envelope": goal["envelope"]}))
    ''')
    assert got["refused"] == ["InvalidInputError"] * 4
    assert got["made"] == [f"c{i}" for i in range(5)] and got["three"] == ["k0", "k1", "k2"]
    assert got["fourth"] == "BudgetExceededError", got  # the goal is carved in full by three live machines
    envelope = got["envelope"]
    assert isinstance(envelope, dict) and envelope["reserved"] == 0 and envelope["limit"] == 3_000_000


# a coordinator's create when the client's machine cap is full: refused after the client's wait, not hung
_FULL = """import json, os, urllib.error, urllib.request
url, token = os.environ["SWARMYARD_BOXD_URL"], os.environ["SWARMYARD_TOKEN"]
request = urllib.request.Request(url + "/v1/machines", data=json.dumps({"name": "kid"}).encode(), method="POST",
                                 headers={"authorization": "Bearer " + token})
try:
    urllib.request.urlopen(request, timeout=120)
    print("created")
except urllib.error.HTTPError as exc:
    error = json.loads(exc.read())["error"]
    print(exc.code, error["code"], error["retryable"])
"""


def test_a_create_past_the_machine_cap_is_refused_after_the_wait(tmp_path: Path) -> None:
    got = _run(tmp_path, '''
        with Boxd(providers=PROVIDERS, max_machines=2, machine_wait_s=1) as b:
            b.machines.create("coord", spawn=True); b.machines.wait_until_ready("coord")
            b.machines.create("filler")
            mine = outcome(lambda: b.machines.create("third"))
            done = b.machines.exec("coord", ["python3", "-c", INSIDE], timeout=120)
            print(json.dumps({"client": mine, "coordinator": done.stdout.strip(),
                              "names": sorted(m.name for m in b.machines.list()),
                              "bad": outcome(lambda: Boxd(providers=PROVIDERS, machine_wait_s=0))}))
    ''', _FULL)
    assert got["client"] == "SandboxError", got  # the client's own create: refused once the wait is over
    assert got["coordinator"] == "500 sandbox_error True", got  # the coordinator's: a retryable refusal, not a hang
    assert got["names"] == ["coord", "filler"], got
    assert got["bad"] == "InvalidInputError", got


_NESTED = """from swarmyard.boxd import Boxd
from swarmyard.errors import UserError
try:
    Boxd().machines.create("kid", spawn=True)
    print("made")
except UserError as exc:
    print("refused", "spawn" in str(exc))
"""


def test_a_coordinators_machine_cannot_be_made_a_coordinator(tmp_path: Path) -> None:
    got = _run(tmp_path, '''
        with Boxd(providers=PROVIDERS) as b:
            b.machines.create("coord", spawn=True); b.machines.wait_until_ready("coord")
            done = b.machines.exec("coord", ["python3", "-c", INSIDE], timeout=120)
            print(json.dumps({"said": done.stdout.strip(), "names": sorted(m.name for m in b.machines.list())}))
    ''', _NESTED)
    assert got == {"said": "refused True", "names": ["coord"]}, got
