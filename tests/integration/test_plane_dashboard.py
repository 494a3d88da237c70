"""The dashboard's routes and the trajectory endpoint over a real socket: who may see what, typed refusals of
bad input that change nothing, trajectories kept within their bounds, and the SSE stream carrying a new post."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from swarmyard.auth.tokens import TokenAuthority
from swarmyard.clock import FakeClock
from swarmyard.domain import GoalSpec, TaskSpec
from swarmyard.plane.app import create_app
from swarmyard.plane.server import BackgroundServer, Listen
from swarmyard.plane.settings import PlaneSettings
from swarmyard.plane.trajectory import TrajectoryFiles, read_trajectory
from swarmyard.store import open_store
from swarmyard.store.protocol import Store


@dataclass
class Rig:
    store: Store
    http: httpx.Client
    operator: str
    worker: str
    worker_id: str
    goal: str
    task: str
    fencing_token: int
    files: TrajectoryFiles

    def op(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.operator}"}

    def as_worker(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.worker}"}


@pytest.fixture
def rig(store_url: str, clock: FakeClock, short_tmp: Path) -> Iterator[Rig]:
    folder = short_tmp
    store = open_store(store_url, clock=clock, blob_dir=folder / "blobs")
    tokens = TokenAuthority(b"k" * 32, store, clock)
    files = TrajectoryFiles(folder / "agents", max_file_bytes=4096)
    app = create_app(store, tokens, PlaneSettings(lease_s=60), clock=clock, trajectories=files)
    goal = store.create_goal(GoalSpec(objective="find <it>", budget_micro_usd=1_000_000, call_cap=100))
    task = store.create_task(goal.id, TaskSpec(title="lens", group="main", budget_micro_usd=100_000, call_cap=10))
    token, who = tokens.issue(goal.id, "main", ttl_s=3600)
    claim = store.claim(goal.id, who.worker_id, 60, task_id=task.id)
    assert claim is not None
    listen = Listen(socket_path=folder / "plane.sock")
    with BackgroundServer(app, listen), httpx.Client(transport=httpx.HTTPTransport(uds=str(listen.socket_path)),
                                                     base_url="http://plane", timeout=30) as http:
        yield Rig(store, http, tokens.issue_operator(), token, who.worker_id, goal.id, task.id, claim.token, files)
    store.close()


def _step(**over: Any) -> dict[str, Any]:
    return {"step": 1, "started_ms": 1_000, "ended_ms": 1_500, "task_id": None,
            "replies": [{"text": "thinking", "input_tokens": 10, "output_tokens": 2, "duration_ms": 500}],
            "action": {"tool": "board_post", "args": {"body": "hi", "weight": 0.5}}, "result": "posted",
            "cpu_ms": 120, "max_rss_kb": 40_000, **over}


def test_no_token_gets_the_login_page_and_no_data_a_worker_token_gets_403(rig: Rig) -> None:
    page = rig.http.get("/ui")
    assert page.status_code == 401 and 'action="/ui/login"' in page.text and rig.goal not in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    for path in ("/ui/api/goals", f"/ui/api/state?goal={rig.goal}", f"/ui/events?goal={rig.goal}",
                 f"/ui/api/trajectory/{rig.worker_id}"):
        none = rig.http.get(path)
        assert none.status_code == 401 and none.json()["error"]["code"] == "invalid_token", path
        worker = rig.http.get(path, headers=rig.as_worker())
        assert worker.status_code == 403 and rig.goal not in worker.text, path
        assert rig.http.get(path, headers={"cookie": f"swarmyard_ui={rig.worker}"}).status_code == 403, path
    assert rig.http.get("/ui", headers=rig.as_worker()).status_code == 403
    state = rig.http.get("/ui/api/state", params={"goal": rig.goal}, headers=rig.op())
    assert state.status_code == 200 and state.json()["goal"]["objective"] == "find <it>"


def test_the_login_form_sets_an_httponly_strict_cookie_for_the_operator_token_only(rig: Rig) -> None:
    refused = rig.http.post("/ui/login", data={"token": rig.worker})
    assert refused.status_code == 403 and "set-cookie" not in refused.headers
    bad = rig.http.post("/ui/login", data={"token": "sy1.x.y"})
    assert bad.status_code == 401 and "set-cookie" not in bad.headers
    elsewhere = rig.http.post("/ui/login", data={"token": rig.operator}, headers={"origin": "http://evil.example"})
    assert elsewhere.status_code == 403 and "set-cookie" not in elsewhere.headers
    cross = rig.http.post("/ui/login", data={"token": rig.operator}, headers={"sec-fetch-site": "cross-site"})
    assert cross.status_code == 403 and "set-cookie" not in cross.headers
    huge = rig.http.post("/ui/login", content=b"token=" + b"a" * 100_000,
                         headers={"content-type": "application/x-www-form-urlencoded"})
    assert huge.status_code == 413 and "set-cookie" not in huge.headers
    ok = rig.http.post("/ui/login", data={"token": rig.operator})
    assert ok.status_code == 303 and ok.headers["location"] == "/ui"
    cookie = ok.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
    page = rig.http.get("/ui", headers={"cookie": f"swarmyard_ui={rig.operator}"})
    assert page.status_code == 200 and 'src="/ui/static/app.js"' in page.text
    out = rig.http.post("/ui/logout", headers={"cookie": f"swarmyard_ui={rig.operator}", "origin": "http://plane"})
    assert out.status_code == 303 and 'swarmyard_ui=""' in out.headers["set-cookie"]


@pytest.mark.parametrize(("path", "status", "field"), [
    ("/ui/api/state", 400, "goal"),
    ("/ui/api/state?goal=../../etc", 400, "goal"),
    ("/ui/api/state?goal=" + "g" * 201, 400, "goal"),
    ("/ui/api/state?goal=goal_missing", 404, None),
    ("/ui/events?goal=a%20b", 400, "goal"),
    ("/ui/events?goal=goal_missing", 404, None),
    ("/ui/api/trajectory/wrk_missing", 404, None),
    ("/ui/api/trajectory/a%20b", 400, "worker_id"),
    ("/ui/api/trajectory/a%2F..%2Fb", 404, None),
    ("/ui/static/..%2F__init__.py", 404, None),
    ("/ui/static/index.html", 404, None),
])
def test_bad_input_is_a_typed_error(rig: Rig, path: str, status: int, field: str | None) -> None:
    answer = rig.http.get(path, headers=rig.op())
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["code"] == ("invalid_input" if status == 400 else "not_found")
    if field:
        assert error["field"] == field


def test_a_worker_s_steps_are_kept_bounded_and_shown_to_the_operator(rig: Rig) -> None:
    kept = rig.http.post("/v1/trajectory/steps", headers=rig.as_worker(), json=_step(task_id=rig.task))
    assert kept.status_code == 200 and kept.json() == {"kept": True}
    path = rig.files.path(rig.worker_id)
    [line] = read_trajectory(path)
    assert line["worker"] == rig.worker_id and line["action"]["args"] == {"body": "hi", "weight": 0.5}
    assert line["replies"][0]["input_tokens"] == 10 and line["ended_ms"] - line["started_ms"] == 500

    before = path.read_bytes()
    for body, status in [
        (_step(extra=1), 400),  # an unknown field
        (_step(step=-1), 400),
        (_step(cpu_ms=1.5), 400),  # integers are integers
        (_step(result="x" * 9000), 400),  # past the text bound
        (_step(replies=[{"text": "t"}] * 17), 400),
        (_step(task_id="../../x"), 400),
    ]:
        answer = rig.http.post("/v1/trajectory/steps", headers=rig.as_worker(), json=body)
        assert answer.status_code == status and answer.json()["error"]["code"] == "invalid_input", answer.text
    deep = rig.http.post("/v1/trajectory/steps", headers=rig.as_worker(),
                         content=b'{"step":1,"action":{"tool":"t","args":' + b'{"a":' * 100 + b"1" + b"}" * 102,
                         )
    assert deep.status_code == 400 and deep.json()["error"]["code"] == "nesting_too_deep"
    assert rig.http.post("/v1/trajectory/steps", json=_step()).status_code == 401
    assert rig.http.post("/v1/trajectory/steps", headers=rig.op(), json=_step()).status_code == 401
    assert path.read_bytes() == before  # nothing refused was written

    # the file stops at its bound, saying so once
    answers = [rig.http.post("/v1/trajectory/steps", headers=rig.as_worker(), json=_step(step=i)).json()["kept"]
               for i in range(2, 30)]
    assert answers[0] is True and answers[-1] is False
    assert path.stat().st_size <= 4096 + 200
    lines = read_trajectory(path)
    assert [line.get("cut") for line in lines].count(True) == 1 and lines[-1]["cut"] is True

    shown = rig.http.get(f"/ui/api/trajectory/{rig.worker_id}", headers=rig.op()).json()
    assert shown["kept"] is True and shown["steps"][0]["action"]["tool"] == "board_post"
    state = rig.http.get("/ui/api/state", params={"goal": rig.goal}, headers=rig.op()).json()
    [worker] = state["workers"]
    assert worker["cpu_ms"] == 120 and worker["max_rss_kb"] == 40_000


def test_the_stream_sends_the_state_then_a_new_board_post(rig: Rig) -> None:
    with rig.http.stream("GET", "/ui/events", params={"goal": rig.goal}, headers=rig.op()) as stream:
        assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
        events = _events(stream.iter_lines())
        first = next(events)
        assert first["goal"]["id"] == rig.goal and first["board"] == []
        posted = rig.http.post("/v1/tools/board_post", headers=rig.as_worker(),
                               json={"task_id": rig.task, "fencing_token": rig.fencing_token, "body": "found it"})
        assert posted.status_code == 200
        second = next(events)
        assert [p["body"] for p in second["board"]] == ["found it"]
        assert second["tasks"][0]["fencing_token"] == rig.fencing_token


def _events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if line.startswith("data: "):
            yield json.loads(line[len("data: "):])


def test_a_stopping_server_ends_open_streams(store_url: str, clock: FakeClock, short_tmp: Path) -> None:
    import threading

    folder = short_tmp
    store = open_store(store_url, clock=clock, blob_dir=folder / "blobs")
    tokens = TokenAuthority(b"k" * 32, store, clock)
    goal = store.create_goal(GoalSpec(objective="o", budget_micro_usd=1_000, call_cap=10))
    listen = Listen(socket_path=folder / "plane.sock")
    server = BackgroundServer(create_app(store, tokens, clock=clock), listen).start()
    stopper = threading.Thread(target=server.stop)
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(listen.socket_path)), base_url="http://plane",
                          timeout=20) as http, \
                http.stream("GET", "/ui/events", params={"goal": goal.id},
                            headers={"authorization": f"Bearer {tokens.issue_operator()}"}) as stream:
            lines = stream.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            stopper.start()
            rest = list(lines)  # ends (the server ends the stream) well before the read timeout
        assert all(not line.startswith("data: ") or '"goal"' in line for line in rest)
        stopper.join()
        assert not server._thread.is_alive()
    finally:
        store.close()
