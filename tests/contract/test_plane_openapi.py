"""schemathesis against the published OpenAPI schema: no generated request makes the plane answer 5xx."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from swarmyard.auth.tokens import TokenAuthority
from swarmyard.clock import FakeClock
from swarmyard.domain import GoalSpec, TaskSpec
from swarmyard.plane.app import create_app
from swarmyard.plane.settings import PlaneSettings
from swarmyard.plane.trajectory import TrajectoryFiles
from swarmyard.store import open_store


class _Tokens:
    worker = ""
    operator = ""


TOKENS = _Tokens()


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    folder: Path = tmp_path_factory.mktemp("openapi")
    clock = FakeClock()
    store = open_store(f"sqlite:///{folder / 'store.db'}", clock=clock)
    tokens = TokenAuthority(b"s" * 32, store, clock)
    goal = store.create_goal(GoalSpec(objective="fuzz", budget_micro_usd=10**9, call_cap=10**6))
    for i in range(5):
        store.create_task(goal.id, TaskSpec(title=f"t{i}", budget_micro_usd=1000, call_cap=10))
    TOKENS.worker = tokens.issue(goal.id, "main", ttl_s=10**6)[0]
    TOKENS.operator = tokens.issue_operator()
    app = create_app(store, tokens, PlaneSettings(rate_per_s=10**6, rate_burst=10**6), clock=clock,
                     trajectories=TrajectoryFiles(folder / "agents"))  # steps are written, not just acknowledged
    yield schemathesis.openapi.from_asgi("/openapi.json", app)
    store.close()


schema = schemathesis.pytest.from_fixture("api_schema")


def test_the_schema_is_published(api_schema: Any) -> None:
    paths = api_schema.raw_schema["paths"]
    assert "/v1/tools/claim_task" in paths and "/v1/operator/goals" in paths
    assert len([p for p in paths if p.startswith("/v1/tools/")]) == 10
    assert "/v1/trajectory/steps" in paths


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case: Any) -> None:
    token = TOKENS.operator if case.path.startswith("/v1/operator") else TOKENS.worker
    response = case.call(headers={"Authorization": f"Bearer {token}"})
    assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:500])
    if response.status_code >= 400:
        assert response.json()["error"]["code"]
