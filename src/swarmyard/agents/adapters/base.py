"""What every external-agent adapter takes and gives: a context in, a launch (files, argv, env) out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # not at run time: ``python -m ...adapters.venvs`` must not find itself imported already
    from swarmyard.agents.adapters.venvs import AgentVenv


@dataclass(frozen=True, slots=True)
class AdapterContext:
    """What an adapter needs to point an agent CLI at the broker through the in-sandbox relay."""

    relay_url: str  # e.g. http://127.0.0.1:8765, the relay to the control plane inside the machine
    token: str  # the worker's capability token: the only "API key" the agent ever sees
    model: str
    prompt: str
    home: str = "/home/worker"
    workdir: str = "/work"
    mcp_command: tuple[str, ...] = ("swarmyard", "mcp")
    #: the claim the launcher made for the worker, if it made one (the MCP server fills it into every call)
    task_id: str | None = None
    fencing_token: int | None = None
    #: a governed worker: the CLI starts with its own tools (shell, files, web) off and swarmyard's MCP tools only
    governed: bool = False

    @property
    def mcp_env(self) -> dict[str, str]:
        """The environment of the ``swarmyard mcp`` server the agent starts."""
        env = {"SWARMYARD_PLANE_URL": self.relay_url, "SWARMYARD_TOKEN": self.token}
        if self.governed:  # it locks exec for itself before it reads its first message
            env["SWARMYARD_PROFILE"] = "governed"
        if self.task_id is not None and self.fencing_token is not None:
            env |= {"SWARMYARD_TASK_ID": self.task_id, "SWARMYARD_FENCING_TOKEN": str(self.fencing_token)}
        return env


@dataclass(frozen=True, slots=True)
class AgentLaunch:
    """How to run an agent: files to write first (absolute path -> text), the command line and its env."""

    argv: tuple[str, ...]
    env: dict[str, str]
    files: dict[str, str] = field(default_factory=dict)


class Adapter(Protocol):
    """Turns a context into a launch for one agent CLI."""

    name: str
    #: the package that installs the CLI, for error messages: ``npm:@openai/codex`` or ``pypi:aider-chat``
    package: str
    #: a PyPI agent's own environment (machines see it through a baseline); ``None`` for one on the PATH
    venv: AgentVenv | None
    #: for an agent that speaks no MCP: the file (relative to its home) it writes its result into, which the
    #: launcher submits as its finding through the control plane; ``None`` when the agent submits it itself
    finding_file: str | None
    #: why this CLI cannot run as a governed worker (``None``: it can, with its own tools off)
    governed_refusal: str | None

    def launch(self, ctx: AdapterContext) -> AgentLaunch:
        """The files, command line and environment that run this agent headless."""
        ...


def base_env(ctx: AdapterContext) -> dict[str, str]:
    """The small environment every agent starts from (never the host's)."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": ctx.home,
        "LANG": "C.UTF-8",
        "NO_COLOR": "1",
        "SWARMYARD_PLANE_URL": ctx.relay_url,
        "SWARMYARD_TOKEN": ctx.token,
    }


WORKER_INSTRUCTIONS = (
    "You are a worker in a swarmyard swarm. Use the swarmyard tools: claim_task first, read the board, post "
    "progress, and finish with submit_finding carrying your result and citations.\n\nObjective: {prompt}"
)
