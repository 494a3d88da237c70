"""The operator API, /metrics, mutual TLS on TCP and ``swarmyard serve``'s refusal, over real sockets."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_plane_tools import Plane, start_plane

from swarmyard.auth.tokens import TokenAuthority
from swarmyard.clock import FakeClock
from swarmyard.plane.app import create_app
from swarmyard.plane.certs import init_certs
from swarmyard.plane.server import BackgroundServer, Listen, TlsFiles
from swarmyard.store import open_store


@pytest.fixture
def plane(store_url: str, clock: FakeClock) -> Iterator[Plane]:
    yield from start_plane(store_url, clock)


def test_operator_flow_and_metrics(plane: Plane) -> None:
    op = {"authorization": f"Bearer {plane.operator}"}
    goal = plane.http.post("/v1/operator/goals", headers=op,
                           json={"objective": "o", "budget_micro_usd": 500_000, "call_cap": 50}).json()["goal"]
    task = plane.http.post(f"/v1/operator/goals/{goal['id']}/tasks", headers=op,
                           json={"title": "t", "group": "g1", "budget_micro_usd": 1000}).json()["task"]
    issued = plane.http.post(f"/v1/operator/goals/{goal['id']}/workers", headers=op, json={"group": "g1"})
    assert issued.status_code == 201
    token, worker = issued.json()["token"], issued.json()["worker"]
    assert "token_hash" not in worker
    claim = plane.ok("claim_task", token)
    assert claim["task"]["id"] == task["id"]
    plane.ok("board_post", token, task_id=task["id"], fencing_token=claim["fencing_token"], body="hello")

    listed = plane.http.get(f"/v1/operator/goals/{goal['id']}/workers", headers=op).json()["workers"]
    assert [w["id"] for w in listed] == [worker["id"]]
    tasks = plane.http.get(f"/v1/operator/goals/{goal['id']}/tasks", headers=op,
                           params={"state": "claimed"}).json()["tasks"]
    assert [t["id"] for t in tasks] == [task["id"]]
    board = plane.http.get(f"/v1/operator/goals/{goal['id']}/board", headers=op).json()["posts"]
    assert [p["body"] for p in board] == ["hello"]
    assert plane.http.get(f"/v1/operator/goals/{goal['id']}/findings", headers=op).json()["findings"] == []
    bad = plane.http.get(f"/v1/operator/goals/{goal['id']}/tasks", headers=op, params={"state": "sleeping"})
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "state"
    assert plane.http.get("/v1/operator/goals/nope", headers=op).status_code == 404
    # a worker token is not an operator token
    assert plane.http.get("/v1/operator/goals", headers={"authorization": f"Bearer {token}"}).status_code == 403

    assert plane.http.get("/metrics").status_code == 401
    text = plane.http.get("/metrics", headers=op).text
    assert 'swarmyard_tool_calls_total{status="200",tool="board_post"} 1.0' in text
    assert f'swarmyard_live_claims{{goal="{goal["id"]}"}} 1.0' in text
    assert f'swarmyard_workers{{goal="{goal["id"]}"}} 1.0' in text
    assert "swarmyard_board_posts_total 1.0" in text
    assert "swarmyard_tool_call_seconds_bucket" in text


def test_tcp_with_mutual_tls(tmp_path: Path, clock: FakeClock) -> None:
    certs = init_certs(tmp_path / "certs", ["127.0.0.1"])
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}", clock=clock)
    tokens = TokenAuthority(b"m" * 32, store, clock)
    listen = Listen(socket_path=None, tcp_host="127.0.0.1", tcp_port=0,
                    tls=TlsFiles(certs.server_cert, certs.server_key, certs.ca_cert))
    with BackgroundServer(create_app(store, tokens, clock=clock), listen) as server:
        url = f"https://127.0.0.1:{server.tcp_port}"
        ctx = ssl.create_default_context(cafile=str(certs.ca_cert))
        ctx.load_cert_chain(str(certs.client_cert), str(certs.client_key))
        with httpx.Client(verify=ctx) as http:
            assert http.get(f"{url}/healthz").json()["ok"] is True
        anonymous = ssl.create_default_context(cafile=str(certs.ca_cert))
        with httpx.Client(verify=anonymous) as http, pytest.raises(httpx.TransportError):
            http.get(f"{url}/healthz")
    store.close()


def test_serve_refuses_public_tcp_without_tls(tmp_path: Path) -> None:
    # this environment's own console script (a virtual environment's, say), not whichever is first on PATH
    here = Path(sys.executable).parent / "swarmyard"
    exe = str(here) if here.exists() else shutil.which("swarmyard") or str(here)
    done = subprocess.run([exe, "serve", "--store", f"sqlite:///{tmp_path / 'store.db'}", "--host", "0.0.0.0",
                           "--socket", str(tmp_path / "p.sock"), "--secret-file", str(tmp_path / "secret")],
                          capture_output=True, text=True, timeout=60, env={"PATH": str(Path(exe).parent)},
                          cwd=tmp_path)
    assert done.returncode == 1
    assert "mutual TLS" in done.stderr
    assert not (tmp_path / "store.db").exists() and not (tmp_path / "secret").exists()
