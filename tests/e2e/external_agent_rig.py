"""What the external-agent e2e tests share: a one-worker swarm file on the scripted provider, and the check that
the agent CLI is installed."""

from __future__ import annotations

import shutil
from pathlib import Path

from swarmyard.agents.adapters import get_adapter, venvs

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
