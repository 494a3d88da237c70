"""The dashboard on TCP answers only by its own host, and only its own page can log its user out.

A real ``swarmyard serve --host 127.0.0.1 --ui-host dash.test`` (the console script), reached over TCP by a real
HTTP client:

- DNS rebinding: a request naming another host (``Host: evil.example:PORT``, the listening port with another
  name, a name of the allow-list with another port, a bare address without the port) is refused 421 with a message
  that says how to open the dashboard, and carries no data even with the operator token;
- the listening address, ``localhost`` (it is loopback) and the ``--ui-host`` name are served;
- a cross-site logout (another site's Origin, ``Sec-Fetch-Site: cross-site``, a foreign Referer, or none of the
  three) is refused 403 without touching the cookie, and the session still reads the data; the dashboard's own
  page logs out;
- on the Unix socket (no browser's) the Host is not checked;
- ``swarmyard run --ui --ui-host NAME`` serves the run's dashboard by that name too, and refuses another.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from rigs.network import free_port as _free_port

SWARMYARD = Path(sys.executable).with_name("swarmyard")


@dataclass
class Dash:
    folder: Path
    port: int
    operator: str

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def dash() -> Iterator[Dash]:
    folder = Path(tempfile.mkdtemp(prefix="sy-dh-"))  # short: Unix socket paths are limited
    port = _free_port()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    proc = subprocess.Popen([str(SWARMYARD), "serve", "--socket", str(folder / "p.sock"),
                             "--store", f"sqlite:///{folder / 'store.db'}", "--secret-file", str(folder / "secret"),
                             "--operator-token-file", str(folder / "operator-token"), "--host", "127.0.0.1",
                             "--port", str(port), "--ui-host", "dash.test"],
                            cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # it says where it listens once it is about to serve
        assert f"http://127.0.0.1:{port}" in line, line + proc.stderr.read()
        yield Dash(folder, port, (folder / "operator-token").read_text().strip())
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


def _client(d: Dash) -> httpx.Client:
    # the transport retries a refused connection while the server starts
    return httpx.Client(base_url=d.base, timeout=30, transport=httpx.HTTPTransport(retries=20))


def test_a_forged_host_is_refused_421_and_reads_nothing(dash: Dash) -> None:
    bearer = {"authorization": f"Bearer {dash.operator}"}
    with _client(dash) as http:
        assert http.get("/ui/api/goals", headers=bearer).status_code == 200  # the right host: served
        for host in (f"evil.example:{dash.port}", "evil.example", f"dash.test:{dash.port + 1}", "127.0.0.1",
                     f"127.0.0.2:{dash.port}", f"dash.test.evil.example:{dash.port}", ""):
            for path in ("/ui", "/ui/api/goals", "/ui/static/app.js", "/ui/events?goal=g"):
                answer = http.get(path, headers={**bearer, "host": host})
                assert answer.status_code == 421, (host, path, answer.status_code)
                error = answer.json()["error"]
                assert error["code"] == "misdirected_request"
                assert f"127.0.0.1:{dash.port}" in error["message"] and "--ui-host" in error["message"]
                assert "goals" not in answer.json()
            answer = http.post("/ui/login", headers={"host": host, "origin": f"http://{host}"},
                               data={"token": dash.operator})
            assert answer.status_code == 421 and "set-cookie" not in answer.headers


def test_the_listening_address_localhost_and_the_ui_host_are_served(dash: Dash) -> None:
    bearer = {"authorization": f"Bearer {dash.operator}"}
    with _client(dash) as http:
        for host in (f"127.0.0.1:{dash.port}", f"localhost:{dash.port}", f"LOCALHOST:{dash.port}",
                     f"dash.test:{dash.port}"):
            answer = http.get("/ui/api/goals", headers={**bearer, "host": host})
            assert answer.status_code == 200, (host, answer.text)
            assert answer.json() == {"goals": []}


def test_the_unix_socket_checks_no_host(dash: Dash) -> None:
    transport = httpx.HTTPTransport(uds=str(dash.folder / "p.sock"))
    with httpx.Client(transport=transport, base_url="http://evil.example", timeout=30) as http:
        answer = http.get("/ui/api/goals", headers={"authorization": f"Bearer {dash.operator}"})
    assert answer.status_code == 200


def _logged_in(http: httpx.Client, dash: Dash) -> str:
    """Log in through the form as the dashboard's own page does; the session cookie."""
    answer = http.post("/ui/login", data={"token": dash.operator},
                       headers={"origin": dash.base, "sec-fetch-site": "same-origin"})
    assert answer.status_code == 303, answer.text
    cookie = answer.cookies.get("swarmyard_ui")
    assert cookie == dash.operator
    return cookie


def test_a_cross_site_logout_is_refused_and_the_session_stays(dash: Dash) -> None:
    with _client(dash) as http:
        cookie = _logged_in(http, dash)
        session = {"cookie": f"swarmyard_ui={cookie}"}
        forged = [
            {"origin": "http://evil.example"},
            {"origin": "null"},
            {"origin": f"http://localhost:{dash.port}.evil.example"},
            {"sec-fetch-site": "cross-site", "origin": dash.base},
            {"sec-fetch-site": "same-site"},
            {"referer": "http://evil.example/page"},
            {"referer": f"{dash.base}.evil.example/"},
            {},  # a form post that shows where it came from in none of the three
        ]
        for headers in forged:
            answer = http.post("/ui/logout", headers={**session, **headers})
            assert answer.status_code == 403, (headers, answer.status_code)
            assert answer.json()["error"]["code"] == "cross_site"
            assert "set-cookie" not in answer.headers, headers  # the browser's cookie is left as it was
            # the session still reads the data
            assert http.get("/ui/api/goals", headers=session).status_code == 200
        own = http.post("/ui/logout", headers={**session, "origin": dash.base, "sec-fetch-site": "same-origin"})
        assert own.status_code == 303
        assert 'swarmyard_ui=""' in own.headers["set-cookie"] and "Max-Age=0" in own.headers["set-cookie"]
        referred = http.post("/ui/logout", headers={**session, "referer": f"{dash.base}/ui"})
        assert referred.status_code == 303


def test_a_cross_site_login_is_refused(dash: Dash) -> None:
    with _client(dash) as http:
        for headers in ({"origin": "http://evil.example"}, {"sec-fetch-site": "cross-site"},
                        {"referer": "http://evil.example/"}):
            answer = http.post("/ui/login", data={"token": dash.operator}, headers=headers)
            assert answer.status_code == 403 and "set-cookie" not in answer.headers, headers


@pytest.mark.bwrap
@pytest.mark.slow
def test_a_run_with_ui_serves_its_ui_host_and_refuses_others() -> None:
    """``swarmyard run --ui --ui-host dash.test``: the run's dashboard answers by that name and refuses another."""
    folder = Path(tempfile.mkdtemp(prefix="sy-dr-"))  # the run's socket lives in the run folder: keep it short
    try:
        # the worker's one command holds the run open until the test stops it
        (folder / "replies.json").write_text(json.dumps({
            "w": [{"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 600"}}]}], "l": []}))
        (folder / "swarm.toml").write_text(f"""
[goal]
objective = "o"
budget_usd = "1"
call_cap = 20
deadline_s = 900
[[tasks.lenses]]
title = "t"
prompt = "p"
[workers]
count = 1
concurrency = 1
exec_timeout_s = 800
max_steps = 3
model = "w"
[lead]
model = "l"
[providers.script]
kind = "scripted"
models = ["w", "l"]
replies = "replies.json"
[run]
runs_dir = "{folder / 'runs'}"
sandbox = "local"
""")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8",
               "XDG_STATE_HOME": str(folder / "state")}
        proc = subprocess.Popen([str(SWARMYARD), "run", str(folder / "swarm.toml"), "--ui", "--ui-host", "dash.test",
                                 "--no-witness"], cwd=folder, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stderr is not None
            line = next((line for line in proc.stderr if line.startswith("dashboard on ")), "")
            assert line, f"the run never announced its dashboard (exit {proc.poll()})"
            url, token_file = line.split()[2], Path(line.split("operator token in ", 1)[1].rstrip(")\n"))
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            bearer = {"authorization": f"Bearer {token_file.read_text().strip()}"}
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
                assert http.get("/ui/api/goals", headers={**bearer, "host": f"dash.test:{port}"}).status_code == 200
                assert http.get("/ui/api/goals", headers=bearer).status_code == 200
                refused = http.get("/ui/api/goals", headers={**bearer, "host": f"evil.example:{port}"})
                assert refused.status_code == 421 and "dash.test" in refused.json()["error"]["message"]
        finally:
            proc.terminate()
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
