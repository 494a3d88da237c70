"""External agent CLIs in real sandboxes: their first model request reaches the broker with the worker's token.

Codex, Claude Code, opencode and pi install from the npm registry (``scripts/test`` installs them); aider is not
here: ``aider-chat`` pins exact versions of libraries this project also uses (openai, pydantic, ...), so it needs
its own environment made visible inside the machine, which the launcher does not do yet. Each runs through the
runner's own launcher in a ``local`` machine, pointed at the broker through the in-sandbox relay, with the
worker's capability token as its only key. The scripted provider records what reached it; the ledger names
the worker whose token paid. A provider key planted in the host's environment must appear nowhere the agent
could see it.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.broker.providers.scripted import Say, ScriptedProvider
from swarmyard.config import load_config
from swarmyard.store import open_store
from swarmyard.swarm.launcher import WorkerSlot
from swarmyard.swarm.machine_launcher import MachineLauncher
from swarmyard.swarm.setup import create_goal, create_round_tasks

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

PLANTED = "sk-host-key-that-must-never-reach-a-sandbox-0123456789"
MODEL = "scripted-agent-model"


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-x-"))  # the plane's socket lives in the run folder: keep it short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _swarm_file(folder: Path, agent: str) -> Path:
    path = folder / "swarm.toml"
    path.write_text(f"""
[goal]
objective = "Say hello to the team."
budget_usd = "1"
call_cap = 50
deadline_s = 600
[[tasks.lenses]]
title = "greet"
prompt = "Say hello."
[policy]
kind = "team"
[workers]
agent = "{agent}"
count = 1
concurrency = 1
exec_timeout_s = 90
model = "{MODEL}"
[lead]
model = "{MODEL}"
[providers.script]
kind = "scripted"
models = ["{MODEL}"]
[run]
runs_dir = "{folder / 'runs'}"
sandbox = "local"
""")
    return path


@pytest.mark.parametrize(("agent", "binary"), [("codex", "codex"), ("claude", "claude"), ("opencode", "opencode"),
                                               ("pi", "pi")])
def test_first_request_reaches_the_broker_with_the_worker_token(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, agent: str, binary: str
) -> None:
    assert shutil.which(binary), f"{binary} is not installed: scripts/test installs it from the npm registry"
    monkeypatch.setenv("OPENAI_API_KEY", PLANTED)
    monkeypatch.setenv("ANTHROPIC_API_KEY", PLANTED)
    config = load_config(_swarm_file(short_tmp, agent))
    run_dir = short_tmp / "runs" / "r1"
    run_dir.mkdir(parents=True)
    store = open_store(f"sqlite:///{run_dir / 'store.db'}")
    provider = ScriptedProvider({MODEL: [Say("Hello, team.")] * 20}, name="script")
    launcher = MachineLauncher(config, store, run_dir, {"script": provider})

    async def one_worker() -> None:
        from swarmyard.clock import SystemClock
        from swarmyard.swarm.policies import make_policy

        goal = create_goal(store, config, SystemClock())
        create_round_tasks(store, goal, config, make_policy(config.policy), 0)
        # the coordinator lets a worker claim first; so does this test, under the worker's identity
        await launcher.start(goal)
        try:
            await launcher.run(WorkerSlot("worker-0", "team"))
        finally:
            await launcher.close()

    try:
        asyncio.run(one_worker())
        assert provider.requests, f"{agent}'s first model request never reached the broker"
        reservations = [r for g in store.list_goals() for r in store.list_reservations(g.id)]
        assert reservations, "the broker admitted no call"
        workers = {w.id for g in store.list_goals() for w in store.list_workers(g.id)}
        assert {r.worker_id for r in reservations} <= workers  # paid by the worker's token, nobody else's
        # The planted key is nowhere the agent could have read it: not in what reached the provider, not in
        # the files the launcher wrote into the machine (its disk lives under the run's machines folder).
        assert all(PLANTED not in repr(r) for r in provider.requests)
    finally:
        store.close()
    for path in Path(run_dir).rglob("*"):
        if path.is_file() and path.stat().st_size < 1_000_000:
            assert PLANTED.encode() not in path.read_bytes(), path
