"""What the external-agent e2e tests share: a one-worker swarm file on the scripted provider, the check that
the agent CLI is installed, and one worker run through the machine launcher."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from swarmyard.agents.adapters import get_adapter, venvs
from swarmyard.config import SwarmConfig
from swarmyard.report.data import WorkerSpan
from swarmyard.store.protocol import Store
from swarmyard.swarm.launcher import WorkerSlot
from swarmyard.swarm.machine_launcher import MachineLauncher
from swarmyard.swarm.setup import create_goal, create_round_tasks

MODEL = "scripted-agent-model"


def swarm_file(folder: Path, agent: str) -> Path:
    """A team of one ``agent`` worker and a lead, both on the scripted ``MODEL``, in local machines."""
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


def assert_installed(agent: str) -> None:
    """Fail (not skip) when ``agent`` is missing: scripts/test installs every one of them."""
    spec = get_adapter(agent).venv
    if spec is not None:
        venvs.require(spec)  # the runner's own check: the ConfigError names the command that installs it
    else:
        assert shutil.which(agent), f"{agent} is not installed: scripts/test installs it from the npm registry"


def run_one_worker(config: SwarmConfig, store: Store, launcher: MachineLauncher) -> WorkerSpan:
    """Create the goal and its first round's tasks, start ``launcher``, run the team's ``worker-0`` to its end and
    close the launcher; returns the worker's span.

    The coordinator lets a worker claim first; so does this, under the worker's identity.
    """
    from swarmyard.clock import SystemClock
    from swarmyard.rules.policies import make_policy

    async def one_worker() -> WorkerSpan:
        goal = create_goal(store, config, SystemClock())
        create_round_tasks(store, goal, config, make_policy(config.policy), 0)
        await launcher.start(goal)
        try:
            return await launcher.run(WorkerSlot("worker-0", "team"))
        finally:
            await launcher.close()

    return asyncio.run(one_worker())
