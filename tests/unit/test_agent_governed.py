"""Governed mode's pieces that need no machine: which tools each external CLI is started with (read back from the
flags and config files its adapter writes), what the built-in agent offers, and the swarm file's checks."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest

from swarmyard.agents import governed
from swarmyard.agents.actions import TOOLS
from swarmyard.agents.adapters import AdapterContext, get_adapter
from swarmyard.config import Profile, SwarmConfig, loads_config
from swarmyard.errors import ConfigError, ToolRefusedError
from swarmyard.machines.execs import exec_allowlist, interpreter_of
from swarmyard.plane.tools import TOOL_NAMES


def _ctx(governed_: bool) -> AdapterContext:
    return AdapterContext("http://127.0.0.1:8484", "tok", "m", "do it", home="/machine", workdir="/machine",
                          governed=governed_)


def test_claude_governed_has_no_builtin_tool_and_no_permission_bypass() -> None:
    argv = get_adapter("claude").launch(_ctx(True)).argv
    assert argv[argv.index("--tools") + 1] == ""  # no built-in tool at all
    denied = argv[argv.index("--disallowedTools") + 1].split(",")
    assert {"Bash", "Edit", "Write", "Read", "WebFetch", "Task"} <= set(denied)
    assert argv[argv.index("--allowedTools") + 1] == "mcp__swarmyard"
    assert "--strict-mcp-config" in argv and "bypassPermissions" not in argv
    assert argv[argv.index("--permission-mode") + 1] == "default"
    full = get_adapter("claude").launch(_ctx(False)).argv
    assert "--tools" not in full and full[full.index("--permission-mode") + 1] == "bypassPermissions"


def test_codex_governed_is_read_only_with_its_shell_and_exec_tools_off() -> None:
    launch = get_adapter("codex").launch(_ctx(True))
    [config] = [text for path, text in launch.files.items() if path.endswith("config.toml")]
    parsed = tomllib.loads(config)
    assert parsed["sandbox_mode"] == "read-only"
    # every tool Codex has of its own is off, by its older and its newer feature names
    assert parsed["features"] == {"shell_tool": False, "unified_exec": False, "apply_patch_freeform": False,
                                  "view_image_tool": False, "web_search_request": False, "view_image": False,
                                  "multi_agent": False, "goals": False}
    assert list(parsed["mcp_servers"]) == ["swarmyard"]
    # its read-only sandbox asks approval for every MCP call: swarmyard's own tools, and only they, are approved
    approvals = parsed["mcp_servers"]["swarmyard"]["tools"]
    assert set(approvals) == set(TOOL_NAMES) and {a["approval_mode"] for a in approvals.values()} == {"approve"}
    full = tomllib.loads(next(iter(get_adapter("codex").launch(_ctx(False)).files.values())))
    assert full["sandbox_mode"] == "danger-full-access" and "features" not in full


def test_opencode_governed_switches_every_own_tool_off() -> None:
    launch = get_adapter("opencode").launch(_ctx(True))
    config = json.loads(next(iter(launch.files.values())))
    tools = config["tools"]
    assert all(tools[name] is False for name in ("bash", "edit", "write", "read", "grep", "webfetch", "task"))
    assert tools["swarmyard_*"] is True and list(config["mcp"]) == ["swarmyard"]
    assert config["permission"] == {"bash": "deny", "edit": "deny", "webfetch": "deny"}
    assert "tools" not in json.loads(next(iter(get_adapter("opencode").launch(_ctx(False)).files.values())))


@pytest.mark.parametrize("name", ["aider", "pi"])
def test_a_cli_without_mcp_says_why_it_cannot_be_governed(name: str) -> None:
    refusal = get_adapter(name).governed_refusal
    assert refusal is not None and "MCP" in refusal
    assert all(get_adapter(n).governed_refusal is None for n in ("claude", "codex", "opencode"))


def test_the_governed_builtin_agent_offers_no_machine_tool() -> None:
    offered = governed.offered(TOOLS, governed.GOVERNED, None)
    assert not governed.MACHINE_TOOLS & set(offered)
    assert {"board_read", "board_post", "read_findings", "submit_finding", "submit_artifact"} <= set(offered)
    assert set(governed.offered(TOOLS, governed.FULL, None)) >= governed.MACHINE_TOOLS
    with pytest.raises(ToolRefusedError) as refused:
        governed.refuse("shell", governed.GOVERNED)
    assert (refused.value.code, refused.value.status, refused.value.profile) == ("tool_refused", 403, "governed")
    governed.refuse("shell", governed.FULL)  # a full agent keeps its shell


def test_the_exec_allowlist_holds_the_interpreter_and_its_loader() -> None:
    allow = exec_allowlist((sys.executable,))
    assert allow[0] == str(Path(sys.executable).resolve())
    loader = interpreter_of(allow[0])
    if loader is not None:  # a dynamically linked interpreter: the kernel executes its loader too
        assert str(Path(loader).resolve()) in allow


def test_an_npm_launcher_script_may_execute_its_interpreter_and_its_own_native_binary_only(tmp_path: Path) -> None:
    import os
    import shutil

    from swarmyard.machines.execs import cli_allowlist

    # Codex's layout: bin/tool.js (#!/usr/bin/env node) hands over to vendor/<target>/bin/tool; the package also
    # vendors ripgrep, a bwrap and a helper host, and holds a file named like the CLI that is not a program
    package = tmp_path / "lib" / "node_modules" / "tool"
    (package / "bin").mkdir(parents=True)
    (package / "package.json").write_text("{}")
    script = package / "bin" / "tool.js"
    script.write_text("#!/usr/bin/env node\n")
    script.chmod(0o755)
    vendor = package / "vendor" / "x86_64-unknown-linux-musl"
    for name in ("bin/tool", "path/rg", "resources/bwrap", "bin/tool-helper-host"):
        (vendor / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy("/bin/true", vendor / name)
    (vendor / "docs").mkdir()
    (vendor / "docs" / "tool").write_text("#!/bin/sh\n")
    (vendor / "docs" / "tool").chmod(0o755)
    on_path = tmp_path / "bin"
    on_path.mkdir()
    os.symlink(script, on_path / "tool")
    node = shutil.which("node", path="/usr/local/bin:/usr/bin:/bin")
    allow = cli_allowlist("tool", f"{on_path}:/usr/local/bin:/usr/bin:/bin")
    true_loader = interpreter_of(os.path.realpath("/bin/true"))
    expected = {str(script), os.path.realpath("/usr/bin/env"), str(vendor / "bin" / "tool"),
                *(os.path.realpath(p) for p in (node, true_loader) if p is not None)}
    assert set(allow) == expected
    assert str(package) not in allow  # no execute right beneath the whole package any more


_SWARM = """
[goal]
objective = "o"
budget_usd = "1"
[[tasks.lenses]]
title = "t"
[providers.s]
kind = "scripted"
models = ["m"]
replies = "{replies}"
[workers]
model = "m"
profile = "governed"
{tools}
[lead]
model = "m"
"""


def _parse(tmp_path: Path, tools: str) -> SwarmConfig:
    replies = tmp_path / "r.json"
    replies.write_text("{}")
    return loads_config(_SWARM.format(replies=replies, tools=tools), base_dir=tmp_path)


def test_a_swarm_file_names_shipped_and_own_tools(tmp_path: Path) -> None:
    (tmp_path / "mine.wasm").write_bytes(b"\0asm\1\0\0\0")
    config = _parse(tmp_path, '[[workers.tools]]\nname = "diff"\nwasm = "csvdiff"\nfolder = "task"\n'
                              '[[workers.tools]]\nname = "mine"\nwasm = "mine.wasm"\nwriter = true\n'
                              'params = {path = "path", n = "integer"}\nrequired = ["path"]\n')
    assert config.workers.profile is Profile.GOVERNED
    diff, mine = config.workers.tools
    spec = diff.spec(Path("/x/csvdiff.wasm"), Path("/machine"))
    assert spec.folder == Path("/machine/task") and "left" in spec.params and not spec.writer
    assert mine.wasm == str(tmp_path / "mine.wasm") and mine.spec(Path("m.wasm"), Path(".")).writer


@pytest.mark.parametrize(("tools", "field", "words"), [
    ('[[workers.tools]]\nname = "shell"\nwasm = "csvdiff"', "workers.tools.0.name", "built-in tool"),
    ('[[workers.tools]]\nname = "x"\nwasm = "nosuch"', "workers.tools.0", "no shipped WASI tool"),
    ('[[workers.tools]]\nname = "x"\nwasm = "csvdiff"\nfolder = "../up"', "workers.tools.0.folder", "'..'"),
    ('[[workers.tools]]\nname = "x"\nwasm = "csvdiff"\nparams = {a = "string"}', "workers.tools.0", "shipped"),
    ('[[workers.tools]]\nname = "x"\nwasm = "gone.wasm"\nparams = {}', "workers.tools.0", "cannot read"),
    ('[[workers.tools]]\nname = "x"\nwasm = "csvdiff"\nfuel = 0', "workers.tools.0.fuel", ""),
    ('[[workers.tools]]\nname = "x"\nwasm = "csvdiff"\n[[workers.tools]]\nname = "x"\nwasm = "textsearch"',
     "workers.tools", "two tools are named 'x'"),
    ('[[workers.tools]]\nname = "Bad Name"\nwasm = "csvdiff"', "workers.tools.0.name", ""),
    # the benchmark's modules are built beside the shipped tools but are none
    ('[[workers.tools]]\nname = "x"\nwasm = "echo"', "workers.tools.0", "no shipped WASI tool is named 'echo'"),
    ('[[workers.tools]]\nname = "x"\nwasm = "spin"', "workers.tools.0", "no shipped WASI tool is named 'spin'"),
    ('[[workers.tools]]\nname = "x"\nwasm = "csvdiff"\ntimeout_s = "5"', "workers.tools.0.timeout_s", ""),
    ('[[workers.tools]]\nname = "x"\nwasm = "csvdiff"\nwriter = "yes"', "workers.tools.0.writer", ""),
    ('[[workers.tools]]\nname = "x"\nwasm = "csvdiff"\nfolder = "~"', "workers.tools.0.folder", "'~'"),
    ('[[workers.tools]]\nname = "x"\nwasm = "csvdiff"\nfolder = "~/task"', "workers.tools.0.folder", "'~'"),
])
def test_a_bad_tool_is_a_config_error_naming_its_field(tmp_path: Path, tools: str, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as bad:
        _parse(tmp_path, tools)
    assert bad.value.field == field and words in bad.value.message, (bad.value.field, bad.value.message)


def test_a_governed_worker_on_the_process_backend_is_refused(tmp_path: Path) -> None:
    replies = tmp_path / "r.json"
    replies.write_text("{}")
    text = _SWARM.format(replies=replies, tools="") + '[run]\nsandbox = "process"\n'
    with pytest.raises(ConfigError) as bad:
        loads_config(text, base_dir=tmp_path)
    assert bad.value.field == "workers.profile" and "process backend cannot" in bad.value.message
