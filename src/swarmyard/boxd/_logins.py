"""What logs every agent CLI in a machine into the broker: variables for each exec and files in its home.

The files are the adapters' own (the runner writes the same ones), written once when the machine is ready:
Codex's ``config.toml``, opencode's ``opencode.json``, pi's ``models.json`` and ``settings.json``, and Claude
Code's user settings. The variables point each CLI's base URL at the in-sandbox relay and give it the worker's
capability token as its key, and name the session's model, so a bare ``claude -p "..."`` asks for a model the
broker serves. Nothing here is a provider key: the broker swaps those in upstream.

On an embedded model (``swarmyard.config.EMBEDDED_MODELS``) Claude Code's settings also deny it every tool but
``Read``, and its user config names no MCP server. Offered its 24 tools (and swarmyard's 10 over MCP), the 0.5B
model was seen to spend the first call of a ``claude -p`` of the seed's script on a tool the prompt did not need
(a ``CronCreate``, a ``Skill``, a ``Write``) before it answered, with a prompt of about 3,960 tokens. With ``Read``
alone the prompt is about 1,860 tokens and the lead can still read its reports file; a scout still spends its one
round of tools (now a ``Read``) before it answers. Every machine gets the same settings, so every ``claude -p``
sends the same start of prompt and the broker's cache of it still serves them all. Any other model keeps Claude
Code's whole tool set and swarmyard's tools.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from swarmyard.agents.adapters import AdapterContext, get_adapter
from swarmyard.agents.adapters.claude import ClaudeAdapter
from swarmyard.boxd._plane import Login
from swarmyard.config import EMBEDDED_MODELS
from swarmyard.machines.environment import MACHINE_PYTHON

#: The home a boxd machine's user has (the machine's own disk).
HOME = "/home/boxd"
#: The CLIs whose launch files are written into every machine.
_AGENTS = ("claude", "codex", "opencode", "pi")
#: Variables the adapters set that the machine's own must win over.
_MACHINE_OWNS = frozenset({"PATH", "HOME", "LANG"})


def _context(relay_url: str, login: Login, model: str) -> AdapterContext:
    return AdapterContext(relay_url, login.token, model, prompt="", home=HOME, workdir=HOME,
                          mcp_command=(*MACHINE_PYTHON, "-m", "swarmyard.cli", "mcp"), task_id=login.task_id,
                          fencing_token=login.fencing_token)


@dataclass(frozen=True, slots=True)
class Logins:
    """A machine's login to the broker: the variables of every exec and the files in its home, for one relay."""

    relay_url: str
    env: dict[str, str]
    files: dict[str, str]


def logins(relay_url: str, login: Login, model: str) -> Logins:
    """``environment`` and ``files`` at once, from one pass over the adapters (each one's launch is built once: the
    JSON they write is most of the time this takes)."""
    ctx = _context(relay_url, login, model)
    launches = [get_adapter(agent).launch(ctx) for agent in _AGENTS]
    return Logins(relay_url, _environment(ctx, login, model, [launch.env for launch in launches]),
                  _files(ctx, login, model, [launch.files for launch in launches]))


def environment(relay_url: str, login: Login, model: str) -> dict[str, str]:
    """The variables every exec in the machine gets."""
    return logins(relay_url, login, model).env


def files(relay_url: str, login: Login, model: str) -> dict[str, str]:
    """The files written into the machine's home once it is ready (absolute path -> text)."""
    return logins(relay_url, login, model).files


def _environment(ctx: AdapterContext, login: Login, model: str, launched: list[dict[str, str]]) -> dict[str, str]:
    relay_url = ctx.relay_url
    env: dict[str, str] = {}
    for launch_env in launched:
        env.update({k: v for k, v in launch_env.items() if k not in _MACHINE_OWNS})
    env.update({
        "HOME": HOME,
        "USER": "boxd",
        "LOGNAME": "boxd",
        "OPENAI_BASE_URL": f"{relay_url}/v1",
        "OPENAI_API_KEY": login.token,
        "SWARMYARD_MODEL": model,
        "SWARMYARD_TASK_ID": login.task_id,
        "SWARMYARD_FENCING_TOKEN": str(login.fencing_token),
        # Claude Code asks for its own model names (and a small one for side calls) unless told
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
    })
    return env


def _files(ctx: AdapterContext, login: Login, model: str, launched: list[dict[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for launch_files in launched:
        out.update(launch_files)
    # pi takes its provider and model from its settings when no flag names them
    pi_settings = f"{HOME}/.pi/agent/settings.json"
    settings = json.loads(out.get(pi_settings, "{}"))
    settings |= {"defaultProvider": "swarmyard", "defaultModel": model}
    out[pi_settings] = json.dumps(settings, indent=2)
    # Claude Code's first run asks about onboarding and a key it does not know: answered here
    claude: dict[str, object] = {
        "hasCompletedOnboarding": True,
        "customApiKeyResponses": {"approved": [login.token[-20:]], "rejected": []},
    }
    if model in EMBEDDED_MODELS:  # Read alone (see the module docstring)
        out[f"{HOME}/.claude/settings.json"] = json.dumps(ClaudeAdapter().read_only_settings(), indent=2)
    else:
        claude["mcpServers"] = {"swarmyard": {"command": ctx.mcp_command[0], "args": list(ctx.mcp_command[1:]),
                                              "env": ctx.mcp_env}}
    out[f"{HOME}/.claude.json"] = json.dumps(claude, indent=2)
    return out
