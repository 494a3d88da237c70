"""An unpriced hosted model is refused by every command that builds a broker, before anything exists."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SWARM = """[goal]
objective = "x"
budget_usd = "1"
[tasks]
plan = 1
[workers]
model = "house-model-7"
[lead]
model = "house-model-7"
[providers.vllm]
kind = "openai_compatible"
base_url = "http://127.0.0.1:9/v1"
models = ["house-model-7"]
"""


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "OPENAI_API_KEY": "sk-test-not-used"}
    return subprocess.run([sys.executable, "-m", "swarmyard.cli", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command", [
    ("run", "swarm.toml"),
    ("serve", "--providers", "swarm.toml"),
    ("serve", "--provider", "oa=openai:house-model-7"),
    ("broker", "serve", "--provider", "oa=openai:house-model-7"),
    ("broker", "serve", "--providers", "swarm.toml"),
])
def test_unpriced_model_exits_1_naming_it_and_creates_nothing(tmp_path: Path, command: tuple[str, ...]) -> None:
    (tmp_path / "swarm.toml").write_text(SWARM)
    done = _cli(tmp_path, *command)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "config_error" in lines[0], done.stderr
    assert "price is known for model 'house-model-7'" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["swarm.toml"]  # no store, socket, secret or run


def test_a_priced_file_passes_the_same_check(tmp_path: Path) -> None:
    priced = SWARM + '[providers.vllm.prices.house-model-7]\ninput_usd_per_mtok = "0.2"\noutput_usd_per_mtok = "0.8"\n'
    (tmp_path / "swarm.toml").write_text(priced + "[run]\nsandbox = \"nope\"\n")
    done = _cli(tmp_path, "run", "swarm.toml")
    # past the prices: the next thing wrong with the file is what is named
    assert done.returncode == 1 and "run.sandbox" in done.stderr and "price" not in done.stderr, done.stderr


def test_a_hosted_model_without_its_key_is_refused_before_anything(tmp_path: Path) -> None:
    hosted = SWARM.replace("house-model-7", "gpt-4o-mini").replace(
        'kind = "openai_compatible"\nbase_url = "http://127.0.0.1:9/v1"', 'kind = "openai"')
    (tmp_path / "swarm.toml").write_text(hosted + f'[run]\nruns_dir = "{tmp_path / "runs"}"\n')
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    done = subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", "swarm.toml"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "set OPENAI_API_KEY" in done.stderr and "config_error" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["swarm.toml"]
