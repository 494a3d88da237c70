"""What a governed worker's machine and agent are given: an exec allowlist, the profile, the WASI tools.

``[workers] profile = "governed"`` (and ``[lead] profile``) makes a machine whose processes can execute only the
agent itself and its ELF loader (``Isolation.exec_only``: Landlock's execute right, set by the machine's init,
with every writable mount noexec), a built-in agent that offers only the governed tools and the swarm file's WASI
tools, and external CLIs started with their own tools off. swarmyard's own processes there lock exec for
themselves (``governed.lock``); an external CLI's cannot (see the README for what it can still execute). WASI tools run inside the worker's machine (see ``swarmyard.wasi.runner`` for why).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from swarmyard.agents.settings import FREE, AgentSettings, Role
from swarmyard.config import AgentKind, Profile, SwarmConfig, WasiToolConfig
from swarmyard.machines.execs import cli_allowlist
from swarmyard.machines.protocol import Isolation
from swarmyard.wasi.catalog import SHIPPED, shipped_wasm

#: Where a swarm file's own ``.wasm`` modules are put in a machine (relative to its home), before every run.
MODULES_DIR = ".swarmyard/wasi"
#: The PATH an agent CLI is looked up on (the adapters' ``base_env``).
CLI_PATH = "/usr/local/bin:/usr/bin:/bin"


def profile_of(config: SwarmConfig, role: Role) -> Profile:
    """The profile of a slot: the lead's for the lead, the workers' for workers and the planner."""
    return config.lead.profile if role is Role.LEAD else config.workers.profile


def agent_of(config: SwarmConfig, role: Role) -> AgentKind:
    """Which agent a slot runs (the planner is always the built-in one)."""
    if role is Role.PLANNER:
        return AgentKind.BUILTIN
    return config.lead.agent if role is Role.LEAD else config.workers.agent


def isolation(config: SwarmConfig, role: Role) -> Isolation | None:
    """The machine's isolation: ``None`` (the default) for ``full``; for ``governed`` an exec allowlist of this
    interpreter (the built-in agent and ``swarmyard mcp``) and, for an agent CLI, what that CLI runs."""
    if profile_of(config, role) is not Profile.GOVERNED:
        return None
    programs: tuple[str, ...] = (sys.executable,)
    agent = agent_of(config, role)
    if agent is not AgentKind.BUILTIN:
        programs += cli_allowlist(agent.value, CLI_PATH)
    return Isolation(exec_only=programs)


def agent_settings(config: SwarmConfig, role: Role, settings: AgentSettings) -> AgentSettings:
    """``settings`` with the built-in agent's profile, WASI tools (specs as JSON; folders and uploaded modules
    relative to its working folder, shipped modules by their path in the package), flow, attached result,
    synthesis artifact and (a worker's) finding mode for ``role``."""
    tools = tools_of(config, role)
    specs = [tool.spec(shipped_wasm(tool.wasm) if tool.wasm in SHIPPED else Path(MODULES_DIR) / f"{tool.name}.wasm",
                       Path(".")).to_dict() for tool in tools]
    flow: tuple[str, ...] = ()
    attach = artifact = False
    if role is not Role.PLANNER:
        flow, attach = ((config.lead.flow, config.lead.attach_result) if role is Role.LEAD
                        else (config.workers.flow, config.workers.attach_result))
        artifact = role is Role.LEAD and config.lead.artifact
    finding = config.workers.finding.value if role is Role.WORKER else FREE
    return replace(settings, profile=profile_of(config, role).value, wasi_tools=json.dumps(specs) if specs else "",
                   flow=tuple(flow), attach_result=attach, synthesis_artifact=artifact, finding=finding)


def tools_of(config: SwarmConfig, role: Role) -> tuple[WasiToolConfig, ...]:
    """The WASI tools of a slot: a governed lead's own (else the workers'), none for a full lead."""
    if role is Role.LEAD:
        if profile_of(config, role) is not Profile.GOVERNED:
            return ()
        return config.lead.tools if config.lead.tools is not None else config.workers.tools
    return config.workers.tools


def uploads(config: SwarmConfig, role: Role = Role.WORKER) -> dict[str, bytes]:
    """The swarm file's own modules of a slot, by their path in the machine (re-sent before each run: a writer
    tool's folder may hold them, and what a run starts with is what the swarm file named)."""
    return {f"{MODULES_DIR}/{tool.name}.wasm": Path(tool.wasm).read_bytes()
            for tool in tools_of(config, role) if tool.wasm not in SHIPPED}
