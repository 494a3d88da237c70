"""External agent adapters: the generated configs parse and point at the relay with the worker token only."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest

from swarmyard.agents.adapters import ADAPTERS, AdapterContext, get_adapter, venvs
from swarmyard.errors import ConfigError

CTX = AdapterContext(
    relay_url="http://127.0.0.1:8765",
    token="sy1.worker-token",
    model="qwen-0.5b",
    prompt="Find the risks.",
    home="/home/worker",
    workdir="/work",
)


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_every_adapter_uses_only_the_worker_token(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-secret")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-host-secret")
    adapter = get_adapter(name)
    launch = adapter.launch(CTX)
    if adapter.venv is None:
        assert launch.argv[0] == name  # on the machine's PATH
    else:  # its own environment, in the machine's home through the baseline
        assert launch.argv[:3] == (f"/home/worker/.{name}-venv/bin/python", "-m", adapter.venv.module)
    blob = json.dumps([launch.argv, launch.env, launch.files])
    assert "host-secret" not in blob
    assert "sy1.worker-token" in blob
    assert set(launch.env) >= {"PATH", "HOME", "SWARMYARD_TOKEN"}
    assert all(path.startswith("/home/worker/") for path in launch.files)
    assert any("Find the risks." in arg for arg in launch.argv)


def test_claude_code() -> None:
    launch = get_adapter("claude").launch(CTX)
    assert launch.argv[:2] == ("claude", "-p")
    argv = list(launch.argv)
    assert argv[argv.index("--model") + 1] == "qwen-0.5b"
    mcp_path = argv[argv.index("--mcp-config") + 1]
    assert "--strict-mcp-config" in argv
    server = json.loads(launch.files[mcp_path])["mcpServers"]["swarmyard"]
    assert (server["command"], server["args"]) == ("swarmyard", ["mcp"])
    assert server["env"] == {
        "SWARMYARD_PLANE_URL": "http://127.0.0.1:8765",
        "SWARMYARD_TOKEN": "sy1.worker-token",
    }
    assert launch.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8765"
    assert launch.env["ANTHROPIC_API_KEY"] == "sy1.worker-token"


def test_codex_config_toml() -> None:
    adapter = get_adapter("codex")
    launch = adapter.launch(CTX)
    assert launch.argv[:2] == ("codex", "exec")
    assert "--skip-git-repo-check" in launch.argv
    assert launch.env["CODEX_HOME"] == "/home/worker/.codex"
    config = tomllib.loads(launch.files["/home/worker/.codex/config.toml"])
    assert (config["model"], config["model_provider"]) == ("qwen-0.5b", "swarmyard")
    provider = config["model_providers"]["swarmyard"]
    assert provider == {
        "name": "swarmyard",
        "base_url": "http://127.0.0.1:8765/v1",
        "env_key": "SWARMYARD_TOKEN",
        "wire_api": "responses",
        "supports_websockets": False,
        "request_max_retries": 0,
        "stream_max_retries": 0,
    }
    assert config["mcp_servers"]["swarmyard"]["command"] == "swarmyard"
    assert config["mcp_servers"]["swarmyard"]["env"]["SWARMYARD_TOKEN"] == "sy1.worker-token"


def test_codex_config_escapes_quotes() -> None:
    ctx = AdapterContext(relay_url="http://127.0.0.1:1", token='t"x', model='m"\\', prompt="p")
    config = tomllib.loads(get_adapter("codex").launch(ctx).files["/home/worker/.codex/config.toml"])
    assert config["model"] == 'm"\\'
    assert config["mcp_servers"]["swarmyard"]["env"]["SWARMYARD_TOKEN"] == 't"x'


def test_opencode_config() -> None:
    launch = get_adapter("opencode").launch(CTX)
    assert launch.argv[:4] == ("opencode", "run", "--model", "swarmyard/qwen-0.5b")
    config = json.loads(launch.files[launch.env["OPENCODE_CONFIG"]])
    provider = config["provider"]["swarmyard"]
    assert provider["options"] == {"baseURL": "http://127.0.0.1:8765/v1", "apiKey": "{env:SWARMYARD_TOKEN}"}
    assert "qwen-0.5b" in provider["models"]
    assert config["mcp"]["swarmyard"]["command"] == ["swarmyard", "mcp"]


def test_aider_command_line() -> None:
    adapter = get_adapter("aider")
    launch = adapter.launch(CTX)
    argv = list(launch.argv)
    assert argv[:3] == ["/home/worker/.aider-venv/bin/python", "-m", "aider"]
    assert argv[argv.index("--model") + 1] == "openai/qwen-0.5b"
    assert "Find the risks." in argv[argv.index("--message") + 1]
    assert {"--yes-always", "--no-git", "--no-analytics", "--no-check-update", "--no-stream"} <= set(argv)
    assert argv[argv.index("--map-tokens") + 1] == "0"  # no repo map: --no-git and nothing to map
    # no MCP: it edits finding.md (made empty first), which the launcher submits as its finding
    assert adapter.finding_file == "finding.md"
    assert argv[argv.index("--file") + 1] == "/home/worker/finding.md"
    assert launch.files == {"/home/worker/finding.md": ""}
    assert launch.env["OPENAI_API_BASE"] == "http://127.0.0.1:8765/v1"
    assert launch.env["OPENAI_API_KEY"] == "sy1.worker-token"
    assert launch.env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"  # no price-table download at import


def test_aider_environment_is_pinned_and_named_by_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = get_adapter("aider").venv
    assert spec is not None and spec.requirement.startswith("aider-chat==") and spec.version
    # a new pin, or another interpreter, is a new baseline
    assert spec.baseline.startswith(f"agent-aider-{spec.version}-py{sys.version_info.major}{sys.version_info.minor}-")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert venvs.source_dir(spec) == tmp_path / "swarmyard" / "agents" / spec.baseline
    assert not venvs.installed(spec)
    with pytest.raises(ConfigError, match=r"swarmyard\.agents\.adapters\.venvs aider"):
        venvs.require(spec)
    assert all(get_adapter(name).venv is None for name in ("claude", "codex", "opencode", "pi"))


def test_pi_models_json() -> None:
    launch = get_adapter("pi").launch(CTX)
    assert launch.argv[:2] == ("pi", "-p")
    models = json.loads(launch.files["/home/worker/.pi/agent/models.json"])
    provider = models["providers"]["swarmyard"]
    assert (provider["baseUrl"], provider["api"], provider["apiKey"]) == (
        "http://127.0.0.1:8765/v1",
        "openai-completions",
        "SWARMYARD_TOKEN",
    )
    assert launch.env["PI_CODING_AGENT_DIR"] == "/home/worker/.pi/agent"


def test_unknown_adapter() -> None:
    with pytest.raises(ConfigError, match=r"workers\.agent"):
        get_adapter("hal9000")


@pytest.mark.parametrize("model", ["qwen2.5-coder-0.5b-instruct", "claude-sonnet-4-5"])
def test_a_boxd_machine_s_claude_code_is_set_to_read_only_on_an_embedded_model(model: str) -> None:
    from swarmyard.boxd import _logins
    from swarmyard.boxd._plane import Login
    from swarmyard.config import EMBEDDED_MODELS

    files = _logins.files("http://127.0.0.1:1", Login("w", "sy1.worker-token", "task", 1, "g"), model)
    user = json.loads(files["/home/boxd/.claude.json"])
    settings = files.get("/home/boxd/.claude/settings.json")
    if model in EMBEDDED_MODELS:
        assert settings is not None and "mcpServers" not in user
        denied = set(json.loads(settings)["permissions"]["deny"])
        assert "Read" not in denied
        assert {"Bash", "Write", "Edit", "Glob", "Grep", "Skill", "CronCreate", "Agent", "WebFetch"} <= denied
    else:
        assert settings is None and list(user["mcpServers"]) == ["swarmyard"]
