"""pi (``pi -p``): a models.json provider on the relay, OpenAI chat completions.

pi speaks no MCP: it is told its task in its prompt and writes its result into ``finding.md`` in its home with
its own write tool; when it ends the launcher submits that file as the worker's finding through the control
plane, with the worker's token and the claim's fencing token (as for aider).
"""

from __future__ import annotations

import json

from swarmyard.agents.adapters.base import AdapterContext, AgentLaunch, base_env

INSTRUCTIONS = (
    "You are a worker in a swarmyard swarm. Do the task below, then write your result, with the sources "
    "you relied on, into finding.md in your home folder (replace its contents): that file is submitted as your "
    "finding when you end.\n\nObjective: {prompt}"
)


class PiAdapter:
    """Runs ``pi -p`` with a models.json that holds only the swarmyard provider."""

    name = "pi"
    package = "npm:@mariozechner/pi-coding-agent"
    venv = None
    finding_file = "finding.md"  # no MCP: the launcher submits what it wrote there
    governed_refusal = ("pi speaks no MCP and delivers its finding with its own write tool, so it cannot work with "
                        "its tools off: use the built-in agent, claude, codex or opencode")

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
            INSTRUCTIONS.format(prompt=ctx.prompt),
        )
        # pi's own auto-retry matches "502" in the error text and sends the turn again, whatever
        # x-should-retry says: a call the broker answered upstream_unknown would be held (and billed) twice.
        # The OpenAI SDK under it still retries what the broker marks retryable.
        settings = {"retry": {"enabled": False}}
        return AgentLaunch(argv, env, {f"{agent_dir}/models.json": json.dumps(models, indent=2),
                                       f"{agent_dir}/settings.json": json.dumps(settings, indent=2)})
