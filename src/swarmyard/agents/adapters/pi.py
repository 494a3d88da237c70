"""pi (``pi -p``): a models.json provider on the relay, OpenAI chat completions."""

from __future__ import annotations

import json

from swarmyard.agents.adapters.base import WORKER_INSTRUCTIONS, AdapterContext, AgentLaunch, base_env


class PiAdapter:
    """Runs ``pi -p`` with a models.json that holds only the swarmyard provider."""

    name = "pi"
    package = "npm:@mariozechner/pi-coding-agent"
    venv = None
    finding_file = None  # it submits its finding itself, over MCP

    def launch(self, ctx: AdapterContext) -> AgentLaunch:
        """Files, argv and env for one headless pi run."""
        agent_dir = f"{ctx.home}/.pi/agent"
        models = {
            "providers": {
                "swarmyard": {
                    "baseUrl": ctx.relay_url + "/v1",
                    "api": "openai-completions",
                    "apiKey": "SWARMYARD_TOKEN",
                    "models": [{"id": ctx.model, "name": ctx.model}],
                }
            }
        }
        env = base_env(ctx) | {"PI_CODING_AGENT_DIR": agent_dir}
        argv = (
            "pi",
            "-p",
            "--provider",
            "swarmyard",
            "--model",
            ctx.model,
            WORKER_INSTRUCTIONS.format(prompt=ctx.prompt),
        )
        # pi's own auto-retry matches "502" in the error text and sends the turn again, whatever
        # x-should-retry says: a call the broker answered upstream_unknown would be held (and billed) twice.
        # The OpenAI SDK under it still retries what the broker marks retryable.
        settings = {"retry": {"enabled": False}}
        return AgentLaunch(argv, env, {f"{agent_dir}/models.json": json.dumps(models, indent=2),
                                       f"{agent_dir}/settings.json": json.dumps(settings, indent=2)})
