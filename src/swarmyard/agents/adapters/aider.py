"""aider (``aider --message``): OpenAI-compatible chat through the relay.

aider speaks no MCP, so it cannot call the governed tools itself; the supervisor claims and submits for it.
"""

from __future__ import annotations

from swarmyard.agents.adapters.base import AdapterContext, AgentLaunch, base_env


class AiderAdapter:
    """Runs one non-interactive aider message with no git, no analytics and no update checks."""

    name = "aider"
    package = "pypi:aider-chat"

    def launch(self, ctx: AdapterContext) -> AgentLaunch:
        """argv and env for one headless aider run."""
        env = base_env(ctx) | {
            "OPENAI_API_BASE": ctx.relay_url + "/v1",
            "OPENAI_API_KEY": ctx.token,
            "AIDER_ANALYTICS": "false",
            "AIDER_CHECK_UPDATE": "false",
        }
        argv = (
            "aider",
            "--model",
            f"openai/{ctx.model}",
            "--message",
            ctx.prompt,
            "--yes-always",
            "--no-git",
            "--no-auto-commits",
            "--no-check-update",
            "--no-analytics",
            "--no-show-model-warnings",
            "--no-pretty",
            "--no-stream",
        )
        return AgentLaunch(argv, env)
