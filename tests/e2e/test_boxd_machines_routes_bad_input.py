"""Every ``/v1/machines`` route a coordinator machine calls answers bad input with a 4xx and changes nothing: real
HTTP on the real socket of a Boxd client's embedded plane, with a coordinator's own token.

Found from outside: a 400-digit integer timeout on ``/exec`` and ``/wait`` (``OverflowError``, a 500), a 10 MiB
argv (``exec failed: Broken pipe``, a 500), and a download of a missing file, a folder or ``/proc/self/mem`` (a
500 ``sandbox_error``); after ``kill -9 2`` inside a machine (its init), every route on it answered 500 "not
reachable: Connection refused" and a fork named a host pid and path, while get said ``running``. The property
test sends every route bodies and paths of every shape and checks that no answer is a 5xx and that a refused
request leaves the client's machines and snapshots as they were.
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmyard.boxd import Boxd

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]


@dataclass
class World:
    """A client with a machine of its own and a snapshot of it, a coordinator ``boss`` and boss's ``kid``."""

    boxd: Boxd
    http: httpx.Client
    kid: str
    private: str

    def state(self) -> tuple[list[str], list[tuple[str, int]]]:
        """What a refused request must leave as it was: the client's machines and snapshots."""
        machines = sorted(m.name for m in self.boxd.machines.list())
        snapshots = sorted((s.name, v.version) for s in self.boxd.snapshots.list()
                           for v in self.boxd.snapshots.versions(s.name))
        return machines, snapshots

    def call(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None) -> httpx.Response:
        content = raw if raw is not None else None if body is None else json.dumps(body).encode()
        return self.http.request(method, path, content=content, headers={"content-type": "application/json"})


def _world(folder: Path) -> Iterator[World]:
    (folder / "providers.toml").write_text('[providers.sim]\nkind = "simulated"\nmodels = ["m1"]\n')
    boxd = Boxd(providers=folder / "providers.toml", root=folder / "root")
    try:
        private = boxd.machines.create("private")
        boxd.machines.wait_until_ready(private.id)
        boxd.snapshots.create(private.id, "mine")
        boxd.snapshots.create(private.id, "boss.given")
        boss = boxd.machines.create("boss", spawn=True)
        boxd.machines.wait_until_ready(boss.id)
        token = boxd._local._kept[boss.id].login.token
        plane = boxd._plane_now()
        http = httpx.Client(transport=httpx.HTTPTransport(uds=str(plane.socket)), base_url="http://plane",
                            headers={"authorization": f"Bearer {token}"}, timeout=300)
        world = World(boxd, http, "", private.id)
        made = world.call("POST", "/v1/machines", {"name": "kid"})
        assert made.status_code == 200, made.text
        world.kid = made.json()["id"]
        ran = world.call("POST", "/v1/machines/kid/exec", {
            "command": "mkdir -p folder && mkfifo fifo && ln -s /proc/self/mem mem && ln -s /nowhere/at/all out "
                       "&& ln -s /dev/zero zero && echo hi > file.txt", "timeout": 60})
        assert ran.status_code == 200 and ran.json()["exit_code"] == 0, ran.text
        yield world
        http.close()
    finally:
        boxd.close()


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    folder = Path(tempfile.mkdtemp(prefix="sy-rb-"))
    try:
        yield from _world(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


_HUGE = 10**400
_TEN_MIB = 10 << 20

_REFUSED: list[tuple[str, str, Any, int, str, str | None]] = [
    # route, machine, body, status, code, field
    ("exec", "kid", {"command": "true", "timeout": _HUGE}, 400, "invalid_input", "timeout"),
    ("wait", "kid", {"timeout": _HUGE}, 400, "invalid_input", "timeout"),
    ("exec", "kid", {"command": "true", "timeout": -_HUGE}, 400, "invalid_input", "timeout"),
    ("exec", "kid", {"command": "true", "timeout": -1}, 400, "invalid_input", "timeout"),
    ("exec", "kid", {"command": "true", "timeout": 0}, 400, "invalid_input", "timeout"),
    ("exec", "kid", {"command": "true", "timeout": True}, 400, "invalid_input", "timeout"),
    ("exec", "kid", {"command": "true", "timeout": "10"}, 400, "invalid_input", "timeout"),
    ("exec", "kid", {"command": "true", "timeout": float("inf")}, 400, "invalid_input", "timeout"),
    ("exec", "kid", {"command": "true", "timeout": float("nan")}, 400, "invalid_input", "timeout"),
    ("wait", "kid", {"timeout": 1e308}, 400, "invalid_input", "timeout"),
    ("wait", "kid", {"timeout": [1]}, 400, "invalid_input", "timeout"),
    ("exec", "kid", {"command": ["echo", "x" * _TEN_MIB]}, 413, "payload_too_large", None),
    ("exec", "kid", {"command": "cat", "stdin_b64": base64.b64encode(b"x" * (2 << 20)).decode()}, 413,
     "payload_too_large", None),
    ("exec", "kid", {"command": ["echo", "x" * (200 << 10)]}, 400, "machine_refused", "command"),  # E2BIG
    ("exec", "kid", {"command": ["no-such-program"]}, 400, "machine_refused", "command"),
    ("exec", "kid", {"command": ["true"], "cwd": "/no/such/folder"}, 400, "machine_refused", "command"),
    ("exec", "kid", {"command": 7}, 400, "invalid_input", "command"),
    ("exec", "kid", {"command": []}, 400, "invalid_input", "command"),
    ("exec", "kid", {"command": "true", "stdin_b64": "not base64!"}, 400, "invalid_input", "stdin_b64"),
    ("exec", "kid", {"command": "true", "env": {"A": 1}}, 400, "invalid_input", "env"),
    ("download", "kid", {"path": "no-such-file"}, 404, "not_found", None),
    ("download", "kid", {"path": "/"}, 400, "machine_refused", "path"),
    ("download", "kid", {"path": "folder"}, 400, "machine_refused", "path"),
    ("download", "kid", {"path": "/proc/self/mem"}, 400, "machine_refused", "path"),
    ("download", "kid", {"path": "mem"}, 400, "machine_refused", "path"),  # a symlink to it
    ("download", "kid", {"path": "out"}, 404, "not_found", None),  # a symlink out, to nothing
    ("download", "kid", {"path": "zero"}, 400, "machine_refused", "path"),  # a symlink to a device
    ("download", "kid", {"path": "fifo"}, 400, "machine_refused", "path"),
    ("download", "kid", {"path": "/dev/null"}, 400, "machine_refused", "path"),
    ("download", "kid", {"path": ""}, 400, "invalid_input", "path"),
    ("download", "kid", {"path": _HUGE}, 400, "invalid_input", "path"),
    ("download", "kid", {}, 400, "invalid_input", "path"),
    ("upload", "kid", {"path": "/usr/planted", "data_b64": "aGk="}, 400, "machine_refused", "path"),
    ("upload", "kid", {"path": "folder", "data_b64": "aGk="}, 400, "machine_refused", "path"),
    ("upload", "kid", {"path": "x", "data_b64": "%%%"}, 400, "invalid_input", "data_b64"),
    ("create", "", {"name": _HUGE}, 400, "invalid_input", "name"),
    ("create", "", {"name": "x" * 100}, 400, "invalid_input", "name"),
    ("create", "", {"name": "x", "from_snapshot": _HUGE}, 400, "invalid_input", "from_snapshot"),
    ("create", "", {"name": "x", "from_snapshot": "mine:" + "9" * 400}, 400, "invalid_input", "from_snapshot"),
    ("fork", "kid", {"new_name": ["a"]}, 400, "invalid_input", "new_name"),
]


@pytest.mark.parametrize(("route", "machine", "body", "status", "code", "field"), _REFUSED,
                         ids=[f"{r[0]}-{i}" for i, r in enumerate(_REFUSED)])
def test_bad_input_on_a_machines_route_is_a_4xx_that_changes_nothing(
        world: World, route: str, machine: str, body: Any, status: int, code: str, field: str | None) -> None:
    before = world.state()
    path = "/v1/machines" if route == "create" else f"/v1/machines/{machine}/{route}"
    answer = world.call("POST", path, body)
    error = answer.json()["error"]
    assert (answer.status_code, error["code"]) == (status, code), answer.text[:2000]
    if field is not None:
        assert error.get("field") == field, error
    assert world.state() == before
    assert world.call("GET", "/v1/machines/kid").status_code == 200  # the machine goes on


def test_a_download_of_a_regular_file_still_works(world: World) -> None:
    answer = world.call("POST", "/v1/machines/kid/download", {"path": "file.txt"})
    assert answer.status_code == 200 and base64.b64decode(answer.json()["data_b64"]) == b"hi\n", answer.text


_ROUTES = [("GET", ""), ("POST", ""), ("GET", "/{m}"), ("DELETE", "/{m}"), ("POST", "/{m}/wait"),
           ("POST", "/{m}/exec"), ("POST", "/{m}/fork"), ("POST", "/{m}/upload"), ("POST", "/{m}/download")]
_WORDS = ["kid", "private", "boss", "mine", "given", "boss.given", "mine:1", "given:1", "given:0", "/proc/self/mem",
          "/", "", ".", "..", "../../etc/passwd", "\0", "x" * 70, "fifo", "mem", "zero", "out", "folder", "file.txt",
          "/usr/planted", "aGk=", "%%", "~c~mine.v1"]
_HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(), st.sampled_from([_HUGE, -_HUGE, 2**63, -(2**63), 0, -1]),
    st.floats(), st.sampled_from(_WORDS), st.text(max_size=30),
    st.lists(st.one_of(st.text(max_size=8), st.integers()), max_size=3),
    st.dictionaries(st.text(max_size=6), st.one_of(st.text(max_size=6), st.integers()), max_size=2),
)
# commands that end by themselves: the property is about the routes, not about what a machine runs
_COMMANDS = st.sampled_from(["true", ["true"], "exit 3", "", [], [""], ["a\0b"], ["no-such-program"], "echo hi",
                             ["cat", "fifo-never-written"], "cat file.txt"])


_JUNK = st.one_of(st.binary(max_size=40),
                  st.sampled_from([b"[" * 5000, b"{", b"\xff\xfe", b"1e999", b'{"timeout": 1' + b"0" * 400 + b"}"]))


def _mostly(usual: st.SearchStrategy[Any], rare: st.SearchStrategy[Any], tenths: int = 8) -> st.SearchStrategy[Any]:
    """``usual`` in ``tenths`` of ten draws, ``rare`` in the rest (``one_of`` weighs its branches alike, and
    merges branches that are the same strategy)."""
    return st.integers(0, 9).flatmap(lambda i: usual if i < tenths else rare)


_RAW = _mostly(st.none(), _JUNK)


def _valid_or(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a value the route takes (so a request gets past its first check), else anything at all."""
    return _mostly(valid, _HOSTILE, 7)


_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    # names no path below asks for: a wait on a machine still booting may run out (a retryable 500, not bad input)
    "name": _valid_or(st.sampled_from(["made-1", "made.2", "kid", "x" * 60])),
    "new_name": _valid_or(st.sampled_from(["forked-1", "kid"])),
    "from_snapshot": _valid_or(st.sampled_from(["given", "given:1", "mine", "golden", "boss.given", "given:2"])),
    "command": _mostly(_COMMANDS, _HOSTILE),
    "timeout": _valid_or(st.floats(min_value=1e-9, max_value=30.0)),
    "env": _valid_or(st.dictionaries(st.sampled_from(["A", "PATH", "LD_PRELOAD", "1x"]), st.text(max_size=8),
                                     max_size=2)),
    "cwd": _valid_or(st.sampled_from(["/", "folder", "/tmp", "/proc"])),
    "stdin_b64": _valid_or(st.binary(max_size=20).map(lambda b: base64.b64encode(b).decode())),
    "path": _valid_or(st.sampled_from(_WORDS)),
    "data_b64": _valid_or(st.binary(max_size=20).map(lambda b: base64.b64encode(b).decode())),
    "spawn": _HOSTILE, "baseline": _HOSTILE,
}
#: what each route reads (required: mostly present, so a request reaches the machine), then anything else
_READS = {"": ((), ("name", "from_snapshot", "spawn", "baseline")), "/{m}": ((), ()),
          "/{m}/wait": ((), ("timeout",)), "/{m}/exec": (("command",), ("timeout", "env", "cwd", "stdin_b64")),
          "/{m}/fork": ((), ("new_name",)), "/{m}/upload": (("path", "data_b64"), ()),
          "/{m}/download": (("path",), ())}


def _bodies(template: str) -> st.SearchStrategy[Any]:
    required, optional = _READS[template]
    body = st.fixed_dictionaries({k: _FIELDS[k] for k in required},
                                 optional={k: _FIELDS[k] for k in (*optional, "path", "timeout") if k not in required})
    return _mostly(body, st.one_of(st.fixed_dictionaries({}, optional=_FIELDS), _HOSTILE))


_MACHINES = _mostly(st.just("kid"), st.one_of(
    st.sampled_from(["private", "boss", "nope", "..", "boss.kid", "x" * 300]), st.text(min_size=1, max_size=20)),
    6)


@pytest.fixture
def fresh_world() -> Iterator[World]:
    folder = Path(tempfile.mkdtemp(prefix="sy-rp-"))
    try:
        yield from _world(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(route=st.sampled_from(_ROUTES), machine=_MACHINES, data=st.data(), raw=_RAW)
def test_no_machines_route_answers_5xx_and_a_refusal_changes_nothing(
        fresh_world: World, route: tuple[str, str], machine: str, data: st.DataObject, raw: bytes | None) -> None:
    method, template = route
    body = data.draw(_bodies(template), label="body")
    path = "/v1/machines" + template.replace("{m}", urllib.parse.quote(machine, safe=""))
    if machine == "kid" and method == "DELETE":
        path = "/v1/machines/nope"  # keep the coordinator's one machine: the other routes need it alive
    before = fresh_world.state()
    answer = fresh_world.call(method, path, body, raw=raw)
    assert answer.status_code < 500, (method, path, body, raw, answer.text[:2000])
    if answer.status_code >= 400:
        assert fresh_world.state() == before, (method, path, body, answer.text[:500])


def test_a_machine_whose_init_was_killed_from_inside_is_failed_409_on_every_route_and_deletes(
        fresh_world: World) -> None:
    # the init runs as the same user as the commands, so a command may kill it
    answers = {"kill": fresh_world.call("POST", "/v1/machines/kid/exec", {"command": "kill -9 2", "timeout": 60})}
    for route, body in (("exec", {"command": "true"}), ("download", {"path": "file.txt"}),
                        ("upload", {"path": "x", "data_b64": "aGk="}), ("fork", {"new_name": "copy"}),
                        ("wait", {"timeout": 5})):
        answers[route] = fresh_world.call("POST", f"/v1/machines/kid/{route}", body)
    root = fresh_world.boxd._sync.backend.root
    for route, answer in answers.items():
        error = answer.json()["error"]
        assert (route, answer.status_code, error["code"]) == (route, 409, "machine_not_running"), answer.text[:2000]
        # no host path, host pid or errno text: the machine's id and what is left to do
        assert "/" not in error["message"] and str(root) not in answer.text, answer.text[:2000]
        assert error["machine_id"] == fresh_world.kid
    seen = fresh_world.call("GET", "/v1/machines/kid")
    assert seen.status_code == 200 and seen.json()["status"] == "failed", seen.text
    assert fresh_world.boxd.machines.get("boss.kid").status == "failed"
    assert fresh_world.call("GET", "/v1/machines").json()[0]["status"] == "failed"
    assert fresh_world.call("DELETE", "/v1/machines/kid").status_code == 200
    assert fresh_world.call("GET", "/v1/machines/kid").status_code == 404
    assert sorted(m.name for m in fresh_world.boxd.machines.list()) == ["boss", "private"]
    assert not (root / "m" / fresh_world.kid).exists()  # its folder went with it


def test_a_machine_whose_init_was_stopped_from_inside_is_409_not_responding_on_every_route_and_deletes(
        fresh_world: World) -> None:
    # a command may stop the init as it may kill it: the init then takes requests and never answers them (an upload
    # or download was a bare 500 after 60 s, an exec with no timeout never answered)
    stopped = fresh_world.call("POST", "/v1/machines/kid/exec", {"command": "kill -STOP 2", "timeout": 1})
    # its exit status never comes back: the exec is told so while it waits (it timed out, 200, before)
    assert (stopped.status_code, stopped.json()["error"]["code"]) == (409, "machine_not_responding"), stopped.text
    answers = {}
    for route, body in (("exec", {"command": "true"}), ("download", {"path": "file.txt"}),
                        ("upload", {"path": "x", "data_b64": "aGk="}), ("fork", {"new_name": "copy"})):
        answers[route] = fresh_world.call("POST", f"/v1/machines/kid/{route}", body)
    root = fresh_world.boxd._sync.backend.root
    for route, answer in answers.items():
        error = answer.json()["error"]
        assert (route, answer.status_code, error["code"]) == (route, 409, "machine_not_responding"), answer.text
        assert "/" not in error["message"] and str(root) not in answer.text, answer.text
        assert error["machine_id"] == fresh_world.kid and error["retryable"] is False
    assert fresh_world.call("GET", "/v1/machines/kid").status_code == 200
    assert fresh_world.call("DELETE", "/v1/machines/kid").status_code == 200
    assert fresh_world.call("GET", "/v1/machines/kid").status_code == 404
    assert sorted(m.name for m in fresh_world.boxd.machines.list()) == ["boss", "private"]
    assert not (root / "m" / fresh_world.kid).exists()


def test_an_exec_whose_command_stops_the_init_is_409_not_responding_not_a_wait_for_ever(fresh_world: World) -> None:
    # the check before a call cannot see a stop that comes during it: an exec with no timeout whose command stops
    # the init waited for an answer that never came (the client's own timeout, 300 s, ended it)
    stopped = fresh_world.call("POST", "/v1/machines/kid/exec", {"command": "kill -STOP 2; sleep 600"})
    error = stopped.json()["error"]
    assert (stopped.status_code, error["code"]) == (409, "machine_not_responding"), stopped.text
    assert error["machine_id"] == fresh_world.kid and error["retryable"] is False
    assert fresh_world.call("DELETE", "/v1/machines/kid").status_code == 200
    assert not (fresh_world.boxd._sync.backend.root / "m" / fresh_world.kid).exists()
