"""aider (``aider --message``): OpenAI-compatible chat through the relay, from its own environment.

aider installs from PyPI as ``aider-chat`` and pins exact versions of libraries swarmyard also uses, so it runs
from an environment of its own (:mod:`swarmyard.agents.adapters.venvs`) that machines see through a baseline.

aider speaks no MCP, so it cannot call the governed tools itself. What it gets instead: the launcher claims its
task before it starts (the prompt names the task and carries the board's latest posts), aider writes its result
into ``finding.md`` in its home (editing files is what aider does), and when aider ends the launcher submits that
file as the worker's finding through the control plane with the worker's token and the claim's fencing token.
It cannot post to the board, read findings or delegate.
"""

from __future__ import annotations

from swarmyard.agents.adapters.base import AdapterContext, AgentLaunch, base_env
from swarmyard.agents.adapters.venvs import AgentVenv

#: The pinned aider; ``aider-chat`` pins its own dependencies exactly, so this one line fixes the whole set.
AIDER = AgentVenv(agent="aider", requirement="aider-chat==0.86.2", module="aider")

INSTRUCTIONS = (
    "You are a worker in a swarmyard swarm. Work on the task below and write your result, with the sources "
    "you relied on, into finding.md (replace its contents). That file is submitted as your finding when you end."
    "\n\n{prompt}"
)


class AiderAdapter:
    """Runs one non-interactive aider message with no git, no repo map, no analytics and no update checks."""

    name = "aider"
    package = "pypi:aider-chat"
    venv = AIDER
    finding_file = "finding.md"
    governed_refusal = ("aider speaks no MCP and edits files by design, which a governed worker may not: use the "
                        "built-in agent, claude, codex or opencode")

    def launch(self, ctx: AdapterContext) -> AgentLaunch:
        """argv and env for one headless aider run."""
        env = base_env(ctx) | {
            # litellm reads these for an ``openai/`` model: the relay, and the worker's token as the key
            "OPENAI_API_BASE": ctx.relay_url + "/v1",
            "OPENAI_API_KEY": ctx.token,
            # litellm would fetch its price table from the internet at import; the machine has no network
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "AIDER_ANALYTICS": "false",
            "AIDER_CHECK_UPDATE": "false",
            # the environment is a shared read-only layer: compiled files would land in every machine's disk
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        argv = (
            AIDER.python_in(ctx.home),
            "-m",
            AIDER.module,
            "--model",
            f"openai/{ctx.model}",
            "--message",
            INSTRUCTIONS.format(prompt=ctx.prompt),
            "--file",
            f"{ctx.home}/{self.finding_file}",
            "--yes-always",
            "--no-git",
            "--no-auto-commits",
            "--map-tokens",
            "0",
            "--no-check-update",
            "--no-analytics",
            "--no-show-model-warnings",
            "--no-detect-urls",
            "--no-pretty",
            "--no-stream",
            "--no-fancy-input",
        )
        return AgentLaunch(argv, env, {f"{ctx.home}/{self.finding_file}": ""})
