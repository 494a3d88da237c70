"""opencode (``opencode run``): an OpenAI-compatible provider on the relay, swarmyard tools over MCP."""

from __future__ import annotations

import json

from swarmyard.agents.adapters.base import WORKER_INSTRUCTIONS, AdapterContext, AgentLaunch, base_env


class OpencodeAdapter:
    """Runs ``opencode run`` with an ``opencode.json`` naming the swarmyard provider and MCP server."""

    name = "opencode"
    package = "npm:opencode-ai"
    venv = None
    finding_file = None  # it submits its finding itself, over MCP
    governed_refusal = None
    #: opencode's own tools, each switched off (and its permissions denied) in governed mode
    BUILTIN_TOOLS = ("bash", "edit", "write", "read", "grep", "glob", "list", "patch", "webfetch", "websearch",
                     "codesearch", "todowrite", "todoread", "task", "lsp", "skill")

    def launch(self, ctx: AdapterContext) -> AgentLaunch:
        """Files, argv and env for one headless opencode run."""
        config_path = f"{ctx.home}/.config/opencode/opencode.json"
        config = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            # no side call for a session title: it would cost a model call (and race the first turn)
            "agent": {"title": {"disable": True}},
            "model": f"swarmyard/{ctx.model}",
            "provider": {
                "swarmyard": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "swarmyard",
                    "options": {"baseURL": ctx.relay_url + "/v1", "apiKey": "{env:SWARMYARD_TOKEN}"},
                    "models": {ctx.model: {"name": ctx.model}},
                }
            },
            "mcp": {
                "swarmyard": {
                    "type": "local",
                    "command": list(ctx.mcp_command),
                    "enabled": True,
                    "environment": ctx.mcp_env,
                }
            },
        }
        if ctx.governed:
            config["tools"] = {name: False for name in self.BUILTIN_TOOLS} | {"swarmyard_*": True}
            config["permission"] = {"bash": "deny", "edit": "deny", "webfetch": "deny"}
        env = base_env(ctx) | {"OPENCODE_CONFIG": config_path, "OPENCODE_DISABLE_AUTOUPDATE": "1"}
        argv = (
            "opencode",
            "run",
            "--model",
            f"swarmyard/{ctx.model}",
            WORKER_INSTRUCTIONS.format(prompt=ctx.prompt),
        )
        return AgentLaunch(argv, env, {config_path: json.dumps(config, indent=2)})
