"""Snapshots belong to whoever made them, and the machines root to its user, through the doors a user has (a
Boxd script run as ``python script.py``, a coordinator machine's own HTTP calls, the ``swarmyard`` CLI):

* a coordinator starts machines only from the snapshots its client put in its namespace (``boss.NAME`` is boss's
  ``NAME``): the client's other snapshots, the host operator's and another client's are ``not_found``, answered
  as a name no one used;
* another client's snapshot stays its own after the client's process exited: a second client finds it
  ``not_found`` by name, by version and as a baseline, while a client under the first one's id still reads it;
* a machines root that another uid owns, or that others may write, is refused before anything is made there, and
  so is one reached through a folder or link another uid owns or a folder others may write (not sticky); a
  missing one is made mode 0700;
* a coordinator's snapshot names have no dot: the client's ``boss.x.golden`` is coordinator ``boss.x``'s only.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
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
    path = Path(tempfile.mkdtemp(prefix="sy-so-"))
    (path / "root").mkdir()
    (path / "providers.toml").write_text(_PROVIDERS)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(folder: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}


def _cli(folder: Path, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swarmyard.cli", "machines", "snapshot", *args, "--root", str(root)],
                          cwd=folder, env=_env(folder), capture_output=True, text=True, timeout=600)


def _script(folder: Path, text: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    (folder / "script.py").write_text(text)
    return subprocess.run([sys.executable, "script.py", str(folder / "providers.toml"), str(folder / "root"), *args],
                          input=stdin, cwd=folder, env=_env(folder), capture_output=True, text=True, timeout=600)


_SAME_CLIENT = '''
import sys
from swarmyard.boxd import Boxd
with Boxd(providers=sys.argv[1], root=sys.argv[2]) as boxd:
    private = boxd.machines.create("private")
    boxd.machines.wait_until_ready(private.id)
    boxd.machines.exec(private.id, "echo 'the client only' > secret.txt")
    boxd.snapshots.create(private.id, "mine")          # the client's, in no coordinator's namespace
    boxd.snapshots.create(private.id, "boss.given")    # handed to the coordinator boss as "given"
    boss = boxd.machines.create("boss", spawn=True)
    boxd.machines.wait_until_ready(boss.id)
    boxd.machines.files.upload(boss.id, "inside.py", sys.stdin.read())
    done = boxd.machines.exec(boss.id, "python3 inside.py", timeout=300)
    print(done.stdout, end="")
    print(done.stderr[-3000:], file=sys.stderr)
    print("client sees:", sorted(m.name for m in boxd.machines.list()), sorted(s.name for s in boxd.snapshots.list()))
'''

_INSIDE = '''
import os
import httpx
url, token = os.environ["SWARMYARD_BOXD_URL"], os.environ["SWARMYARD_TOKEN"]
http = httpx.Client(base_url=url, headers={"authorization": "Bearer " + token}, timeout=120)

def ask(method, path, body=None):
    answer = http.request(method, path, json=body)
    error = answer.json().get("error", {}) if answer.status_code >= 400 else {}
    return answer.status_code, error.get("code"), error.get("kind"), error.get("message")

for verb in ("get", "exec", "fork"):  # the client's machine is not this one's to see
    method, path, body = {"get": ("GET", "/v1/machines/private", None),
                          "exec": ("POST", "/v1/machines/private/exec", {"command": "cat secret.txt"}),
                          "fork": ("POST", "/v1/machines/private/fork", {"new_name": "copy"})}[verb]
    print(verb, "private:", *ask(method, path, body)[:3])
answers = {}
for ref in ("mine", "mine:1", "golden", "boss.given", "never-made", "never-made:1"):
    status, code, kind, message = ask("POST", "/v1/machines", {"name": "kid", "from_snapshot": ref})
    answers[ref] = message
    print("from", ref + ":", status, code, kind)
# no oracle: the client's snapshot, the operator's and one never made answer alike, but for the name asked
print("alike:", len({answers[r].replace(r, "REF") for r in ("mine", "golden", "never-made")}) == 1,
      answers["mine:1"].replace("mine:1", "REF") == answers["never-made:1"].replace("never-made:1", "REF"))
print("listed:", [m["name"] for m in http.get("/v1/machines").json()])
status, _, _, _ = ask("POST", "/v1/machines", {"name": "kid", "from_snapshot": "given"})
made = http.get("/v1/machines/kid").json()
print("from given:", status, made["source"]["kind"], made["source"]["name"], made["source"]["version"])
ran = http.post("/v1/machines/kid/exec", json={"command": "cat secret.txt", "timeout": 60}).json()
import base64
print("kid reads:", base64.b64decode(ran["stdout_b64"]).decode().strip())
'''


def test_a_coordinator_starts_machines_only_from_snapshots_in_its_namespace(folder: Path) -> None:
    (folder / "seed").mkdir()
    (folder / "seed" / "secret.txt").write_text("the operator's\n")
    made = _cli(folder, folder / "root", "create", "golden", "--from", str(folder / "seed"))
    assert made.returncode == 0, made.stderr
    done = _script(folder, _SAME_CLIENT, stdin=_INSIDE)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "get private: 404 not_found machine",
        "exec private: 404 not_found machine",
        "fork private: 404 not_found machine",
        "from mine: 404 not_found snapshot",  # the client's own snapshot of a machine boss cannot see
        "from mine:1: 404 not_found snapshot",
        "from golden: 404 not_found snapshot",  # the host operator's: for host clients, never a coordinator
        "from boss.given: 404 not_found snapshot",  # its namespace is not a name it may spell out
        "from never-made: 404 not_found snapshot",
        "from never-made:1: 404 not_found snapshot",
        "alike: True True",
        "listed: []",  # nothing was made by the refusals
        "from given: 200 snapshot given 1",
        "kid reads: the client only",  # what the client handed it in its namespace
        "client sees: ['boss', 'boss.kid', 'private'] ['boss.given', 'golden', 'mine']",
    ], done.stderr[-3000:]


_CLIENT_A = '''
import sys
from swarmyard.boxd import Boxd
with Boxd(providers=sys.argv[1], root=sys.argv[2]) as boxd:
    work = boxd.machines.create("work")
    boxd.machines.wait_until_ready(work.id)
    boxd.machines.exec(work.id, "echo 'alice only' > notes.txt")
    snapshot = boxd.snapshots.create(work.id, "alice-work")
    print(boxd.snapshots.client, snapshot.baseline)
'''

_CLIENT_B = '''
import sys
from swarmyard.boxd import Boxd
from swarmyard.errors import SwarmyardError
alice, baseline = sys.argv[3], sys.argv[4]

def outcome(call):
    try:
        call()
    except SwarmyardError as exc:
        return f"{exc.code} {exc.details.get('kind')}"
    return "made"

with Boxd(providers=sys.argv[1], root=sys.argv[2]) as boxd:
    print("B is another client:", boxd.snapshots.client != alice)
    for label, call in (("by name", lambda: boxd.machines.create("b1", from_snapshot="alice-work")),
                        ("by version", lambda: boxd.machines.create("b2", from_snapshot="alice-work:1")),
                        ("as a baseline", lambda: boxd.machines.create("b3", baseline=baseline)),
                        ("versions", lambda: boxd.snapshots.versions("alice-work")),
                        ("delete", lambda: boxd.snapshots.delete("alice-work"))):
        print("B", label + ":", outcome(call))
    print("B lists:", [s.name for s in boxd.snapshots.list()], [m.name for m in boxd.machines.list()])
    boss = boxd.machines.create("boss", spawn=True)
    boxd.machines.wait_until_ready(boss.id)
    inside = (
        "import os, httpx\\n"
        "url, token = os.environ['SWARMYARD_BOXD_URL'], os.environ['SWARMYARD_TOKEN']\\n"
        "for ref in ('alice-work', 'alice-work:1'):\\n"
        "    a = httpx.post(url + '/v1/machines', json={'name': 'kid', 'from_snapshot': ref},\\n"
        "                   headers={'authorization': 'Bearer ' + token}, timeout=120)\\n"
        "    print('coordinator', ref + ':', a.status_code, a.json()['error']['code'])\\n"
    )
    boxd.machines.files.upload(boss.id, "inside.py", inside)
    done = boxd.machines.exec(boss.id, "python3 inside.py", timeout=300)
    print(done.stdout, end="")
    print(done.stderr[-3000:], file=sys.stderr)

with Boxd(providers=sys.argv[1], root=sys.argv[2], client=alice) as again:  # a later script under A's id
    copy = again.machines.create("copy", from_snapshot="alice-work")
    again.machines.wait_until_ready(copy.id)
    print("A's id reads:", again.machines.exec(copy.id, "cat notes.txt").stdout.strip())
'''


def test_another_clients_snapshot_stays_its_own_after_its_process_exited(folder: Path) -> None:
    made = _script(folder, _CLIENT_A)
    assert made.returncode == 0, made.stderr[-3000:]  # client A's process has exited
    alice, baseline = made.stdout.split()
    assert baseline.startswith(f"~{alice}~")
    done = _script(folder, _CLIENT_B, alice, baseline)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "B is another client: True",
        "B by name: not_found snapshot",
        "B by version: not_found snapshot",
        "B as a baseline: not_found baseline",
        "B versions: not_found snapshot",
        "B delete: not_found snapshot",
        "B lists: [] []",
        "coordinator alice-work: 404 not_found",
        "coordinator alice-work:1: 404 not_found",
        "A's id reads: alice only",
    ], done.stderr[-3000:]
    # the host operator sees it under A's id, and only there; its files are where A left them
    operator = _cli(folder, folder / "root", "list", "--json")
    assert operator.returncode == 0 and json.loads(operator.stdout) == [], operator.stderr
    theirs = _cli(folder, folder / "root", "list", "--json", "--client", alice)
    assert theirs.returncode == 0, theirs.stderr
    assert [(s["name"], s["version"], s["owner"]) for s in json.loads(theirs.stdout)] == [("alice-work", 1, alice)]


_OPEN_ROOT = '''
import sys
from swarmyard.boxd import Boxd
from swarmyard.errors import SwarmyardError
try:
    Boxd(providers=sys.argv[1], root=sys.argv[3]).machines.create("m")
except SwarmyardError as exc:
    print(exc.code, exc.details["why"])
else:
    print("made")
'''


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a folder to another uid needs root")
def test_a_machines_root_another_uid_owns_or_others_may_write_is_refused(folder: Path) -> None:
    theirs, open_to_all = folder / "theirs", folder / "open"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 4242, 4242)
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    for root, why in ((theirs, "belongs to uid 4242"), (open_to_all, "others may write it (mode 777)")):
        refused = _cli(folder, root, "list")
        assert refused.returncode == 1, refused.stdout
        assert "(insecure_root)" in refused.stderr and why in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
        script = _script(folder, _OPEN_ROOT, str(root))
        assert script.returncode == 0, script.stderr[-3000:]
        assert script.stdout.startswith(f"insecure_root {why}"), script.stdout
        assert sorted(p.name for p in root.iterdir()) == []  # nothing was made in it
    fresh = folder / "fresh" / "root"
    made = _script(folder, _OPEN_ROOT, str(fresh))
    assert made.returncode == 0 and made.stdout == "made\n", made.stderr[-3000:]
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700 and fresh.stat().st_uid == os.geteuid()


_NESTED_NAMESPACE = '''
import sys
from swarmyard.boxd import Boxd
with Boxd(providers=sys.argv[1], root=sys.argv[2]) as boxd:
    source = boxd.machines.create("source")
    boxd.machines.wait_until_ready(source.id)
    boxd.machines.exec(source.id, "echo 'for boss.x only' > secret.txt")
    nested = boxd.machines.create("boss.x", spawn=True)
    boxd.machines.wait_until_ready(nested.id)
    boxd.snapshots.create(source.id, "boss.x.golden")  # coordinator boss.x's "golden"
    boxd.machines.delete(nested.id)
    boss = boxd.machines.create("boss", spawn=True)  # free now that boss.x is gone
    boxd.machines.wait_until_ready(boss.id)
    boxd.machines.files.upload(boss.id, "inside.py", sys.stdin.read())
    done = boxd.machines.exec(boss.id, "python3 inside.py", timeout=300)
    print(done.stdout, end="")
    print(done.stderr[-3000:], file=sys.stderr)
'''

_NESTED_INSIDE = '''
import os
import httpx
url, token = os.environ["SWARMYARD_BOXD_URL"], os.environ["SWARMYARD_TOKEN"]
http = httpx.Client(base_url=url, headers={"authorization": "Bearer " + token}, timeout=120)
messages = {}
for ref in ("x.golden", "x.golden:1", "x.never-made", "never-made"):
    answer = http.post("/v1/machines", json={"name": "kid", "from_snapshot": ref})
    error = answer.json()["error"]
    messages[ref] = error["message"].replace(ref, "REF")
    print("from", ref + ":", answer.status_code, error["code"], error.get("kind"))
print("alike:", len({messages[r] for r in ("x.golden", "x.never-made", "never-made")}) == 1)
print("listed:", [m["name"] for m in http.get("/v1/machines").json()])
'''


def test_a_coordinator_does_not_read_the_snapshots_of_a_coordinator_named_under_it(folder: Path) -> None:
    # boss.x.golden is coordinator boss.x's "golden"; it must not also be coordinator boss's "x.golden"
    done = _script(folder, _NESTED_NAMESPACE, stdin=_NESTED_INSIDE)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "from x.golden: 404 not_found snapshot",
        "from x.golden:1: 404 not_found snapshot",
        "from x.never-made: 404 not_found snapshot",
        "from never-made: 404 not_found snapshot",
        "alike: True",
        "listed: []",
    ], done.stderr[-3000:]


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a folder to another uid needs root")
def test_a_machines_root_reached_through_a_folder_or_link_others_control_is_refused(folder: Path) -> None:
    # anyone who may rename an entry on the way to the root could swap it for one of their own mid-run
    open_parent, their_parent, sticky = folder / "open", folder / "theirs", folder / "sticky"
    for made, uid, mode in ((open_parent, 0, 0o777), (their_parent, 4242, 0o755), (sticky, 0, 0o1777)):
        made.mkdir()
        os.chown(made, uid, uid)
        made.chmod(mode)
    their_link = folder / "their-link"
    their_link.symlink_to(open_parent)
    os.lchown(their_link, 4242, 4242)
    my_link = folder / "my-link"
    my_link.symlink_to(open_parent)  # this user's link, into a folder others may write
    (folder / "mine").mkdir(mode=0o700)
    into_theirs = folder / "mine" / "to-theirs"
    into_theirs.symlink_to(their_parent)
    cases = ((open_parent / "root", f"lies in {open_parent}, which others may write and is not sticky"),
             (open_parent / "deeper" / "root", f"lies in {open_parent}, which others may write"),
             (their_parent / "root", f"lies in {their_parent}, which uid 4242 owns"),
             (their_link / "root", f"goes through {their_link}, a symbolic link that uid 4242 made"),
             (my_link / "root", f"lies in {open_parent}, which others may write"),
             (into_theirs / "root", f"lies in {their_parent}, which uid 4242 owns"))
    for root, why in cases:  # a root to be made there
        script = _script(folder, _OPEN_ROOT, str(root))
        assert script.returncode == 0, script.stderr[-3000:]
        assert script.stdout.startswith(f"insecure_root {why}"), (root, script.stdout)
    assert sorted(p.name for p in open_parent.iterdir()) == []  # nothing was made on the way
    assert sorted(p.name for p in their_parent.iterdir()) == []
    (open_parent / "deeper").mkdir(mode=0o700)
    for root, why in cases:  # a root of this user's, mode 0700, that is there already
        root.mkdir(mode=0o700, exist_ok=True)
        script = _script(folder, _OPEN_ROOT, str(root))
        assert script.returncode == 0 and script.stdout.startswith(f"insecure_root {why}"), (root, script.stdout)
        refused = _cli(folder, root, "list")
        assert refused.returncode == 1 and "(insecure_root)" in refused.stderr and why in refused.stderr, \
            (root, refused.stderr)
        assert "Traceback" not in refused.stderr
        assert sorted(p.name for p in root.resolve().iterdir()) == []
    # a root-owned sticky folder others may write (as /tmp) is fine: none of them may rename our entry in it
    made = _script(folder, _OPEN_ROOT, str(sticky / "root"))
    assert made.returncode == 0 and made.stdout == "made\n", made.stdout + made.stderr[-3000:]
