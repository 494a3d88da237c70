"""What a governed Claude Code, Codex and opencode offer their model, read from the first request each sends the
scripted provider, in a real governed machine: swarmyard's MCP tools (and Codex's readers of an MCP server's
resources), none of the CLI's own tools (Codex offered an image viewer that reads the machine's files, sub-agents
and goals; its hosted web search the broker drops)."""

from __future__ import annotations

from pathlib import Path

import pytest
from external_agent_rig import MODEL, assert_installed, run_one_worker, swarm_file

from swarmyard.broker.providers.scripted import CallTools, Say, ScriptedProvider
from swarmyard.config import load_config
from swarmyard.store import open_store
from swarmyard.swarm.machine_launcher import MachineLauncher

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

#: how each CLI names swarmyard's MCP tools to its model
MCP_PREFIX = {"claude": "mcp__swarmyard__", "codex": "mcp__swarmyard__", "opencode": "swarmyard_"}
#: what a CLI offers beside them that is not a tool of its own: Codex's readers of an MCP server's resources
#: (swarmyard's) and its question to the user, which only its Plan mode answers
MCP_READERS = {"claude": set(), "opencode": set(),
               "codex": {"list_mcp_resources", "list_mcp_resource_templates", "read_mcp_resource",
                         "request_user_input"}}


@pytest.mark.parametrize("agent", sorted(MCP_PREFIX))
def test_a_governed_cli_offers_its_model_no_tool_of_its_own(short_tmp: Path, agent: str) -> None:
    assert_installed(agent)
    path = swarm_file(short_tmp, agent)
    path.write_text(path.read_text().replace("[workers]\n", '[workers]\nprofile = "governed"\n'))
    config = load_config(path)
    run_dir = short_tmp / "runs" / "r1"
    run_dir.mkdir(parents=True)
    store = open_store(f"sqlite:///{run_dir / 'store.db'}")
    provider = ScriptedProvider({MODEL: [
        CallTools((("*submit_finding", {"title": "tools", "body": "The governed tools were listed."}),)),
        Say("Submitted."),
    ]}, name="script")
    launcher = MachineLauncher(config, store, run_dir, {"script": provider})

    try:
        span = run_one_worker(config, store, launcher)
        assert span.ending == "done", (span, [p.read_text()[-3000:] for p in (run_dir / "agents").iterdir()])
    finally:
        store.close()
    names = {tool.name for tool in provider.requests[0].tools}
    assert any(name.startswith(MCP_PREFIX[agent]) for name in names), names
    own = {name for name in names if not name.startswith(MCP_PREFIX[agent])} - MCP_READERS[agent]
    assert not own, own  # Codex's before: view_image, multi_agent_v1__*, create_goal, get_goal, update_goal
