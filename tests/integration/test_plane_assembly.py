"""One assembly of a plane and its broker (``swarmyard.plane.assembly``), as ``swarmyard serve``, a run and the
Boxd client build it: the broker's routes mounted on the plane, its model calls counted in ``/metrics`` and kept
with the worker's trajectory, its close run once the server stops, and the listeners served with the connection
limits (here: a request line and headers past 64 KiB answered 431). The module stays below what uses it."""

from __future__ import annotations

import ast
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conftest import claimed_worker
from swarmyard.clock import FakeClock
from swarmyard.config import ProviderConfig, ProviderKind
from swarmyard.plane import assembly
from swarmyard.plane.assembly import assemble
from swarmyard.plane.server import Listen
from swarmyard.plane.settings import PlaneSettings
from swarmyard.plane.trajectory import TrajectoryFiles
from swarmyard.store import SqlStore, open_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    opened = open_store(f"sqlite:///{tmp_path / 'store.db'}", clock=FakeClock())
    yield opened
    opened.close()


def test_the_assembled_plane_serves_its_broker_counts_its_calls_and_keeps_the_limits(store: SqlStore,
                                                                                      tmp_path: Path) -> None:
    worker = claimed_worker(store, FakeClock(), secret=b"a" * 32)
    files = TrajectoryFiles(tmp_path / "agents")
    files.label(worker.worker_id, "worker-0")
    made = assemble(store, worker.tokens, PlaneSettings(), trajectories=files,
                    providers={"sim": ProviderConfig(kind=ProviderKind.SIMULATED, models=("m1",))})
    assert made.broker is not None
    assert made.app.state.on_close == [made.broker.aclose]  # the broker closed once the server has stopped
    assert made.core is made.app.state.plane
    me = {"authorization": f"Bearer {worker.token}"}
    sock = tmp_path / "plane.sock"
    with made.background(Listen(sock)), \
            httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://plane", timeout=30) as http:
        chat = http.post("/v1/chat/completions", headers=me,
                         json={"model": "m1", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 200, chat.text
        assert made.broker.wait_settled(10)
        step = http.post("/v1/trajectory/steps", headers=me, json={"step": 1, "started_ms": 1, "ended_ms": 2})
        assert step.status_code == 200 and step.json() == {"kept": True}
        scraped = http.get("/metrics", headers={"authorization": f"Bearer {worker.tokens.issue_operator()}"})
        assert scraped.status_code == 200
        # past 64 KiB of request line and headers: answered 431 without the rest being read
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.settimeout(30)
            raw.connect(str(sock))
            raw.sendall(b"GET /healthz HTTP/1.1\r\nhost: plane\r\nx-big: " + b"a" * (70 << 10))
            assert raw.recv(64).startswith(b"HTTP/1.1 431")
    counted = [line for line in scraped.text.splitlines()
               if line.startswith("swarmyard_model_call_seconds_count{") and 'model="m1"' in line]
    assert len(counted) == 1 and counted[0].endswith(" 1.0"), scraped.text
    [line] = [json.loads(x) for x in (tmp_path / "agents" / "worker-0.jsonl").read_text().splitlines()]
    assert [c["outcome"] for c in line["calls"]] == ["settled"]


def test_a_plane_with_no_providers_has_no_broker(store: SqlStore) -> None:
    worker = claimed_worker(store, FakeClock(), secret=b"b" * 32)
    made = assemble(store, worker.tokens, PlaneSettings())
    assert made.broker is None and made.app.state.on_close == []
    assert not any(getattr(r, "path", "") == "/v1/chat/completions" for r in made.app.routes)


def test_the_assembly_imports_nothing_above_the_plane() -> None:
    tree = ast.parse(Path(assembly.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert "swarmyard.plane.server" in imported  # the walk sees the module's imports
    assert [m for m in imported if m.startswith(("swarmyard.swarm", "swarmyard.boxd", "swarmyard.cli",
                                                 "swarmyard.bench"))] == []
