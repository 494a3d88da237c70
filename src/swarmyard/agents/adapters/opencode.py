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

    def launch(self, ctx: AdapterContext) -> AgentLaunch:
        """Files, argv and env for one headless opencode run."""
        config_path = f"{ctx.home}/.config/opencode/opencode.json"
        config = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
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
        env = base_env(ctx) | {"OPENCODE_CONFIG": config_path, "OPENCODE_DISABLE_AUTOUPDATE": "1"}
        argv = (
            "opencode",
            "run",
            "--model",
            f"swarmyard/{ctx.model}",
            WORKER_INSTRUCTIONS.format(prompt=ctx.prompt),
        )
        return AgentLaunch(argv, env, {config_path: json.dumps(config, indent=2)})
