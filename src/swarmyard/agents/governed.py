"""What a governed built-in agent offers its model: the governed tools and the swarm file's WASI tools, nothing
that touches its machine (no shell, no files).

The refusal here is the agent's; the guarantee is the sandbox's: a governed machine lets its processes execute
only the agent's interpreter and its loader (Landlock, from the machine's init), its writable mounts are noexec,
and the agent takes even that away from itself as it starts (:func:`lock`), so a shell the model asked for could
not run even if this table offered one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from swarmyard.agents.actions import TOOLS, ToolSpec
from swarmyard.errors import ConfigError, SandboxError, ToolRefusedError

FULL = "full"
GOVERNED = "governed"
#: The tools that act on the agent's own machine, which a governed agent does not have.
MACHINE_TOOLS = frozenset({"shell", "read_file", "write_file"})


def lock(profile: str, who: str) -> None:
    """Under ``governed``, lock exec for this process for good (``seccomp.lock_exec``): the built-in agent before
    it reads its model's first reply, ``swarmyard mcp`` before it reads its first message. The machine lets them
    execute the interpreter and its loader, and the loader runs any program under /usr it is given; after this,
    nothing. ``SandboxError`` when the kernel refuses the filter (``who`` names the process), ``ConfigError`` for a
    profile that is neither ``full`` nor ``governed``."""
    if profile not in (FULL, GOVERNED):
        raise ConfigError(f"must be {FULL!r} or {GOVERNED!r}, not {profile!r}", field="SWARMYARD_PROFILE")
    if profile != GOVERNED:
        return
    from swarmyard.guest.seccomp import lock_exec  # a governed process's alone: it loads platform

    try:
        lock_exec()
    except OSError as exc:  # a governed process does not run without it
        raise SandboxError(f"cannot lock exec for a governed {who}: {exc}") from exc


def refuse(tool: str, profile: str) -> None:
    """Raise ``ToolRefusedError`` when ``profile`` does not offer ``tool``."""
    if profile == GOVERNED and tool in MACHINE_TOOLS:
        raise ToolRefusedError(tool, profile)


class WasiTools:
    """The WASI tools of one agent run, each module compiled once when the run starts."""

    def __init__(self, specs: list[Any]) -> None:
        from swarmyard.wasi import WasiRunner

        self.specs = {spec.name: spec for spec in specs}
        self._runner = WasiRunner()
        for spec in specs:
            self._runner.module(spec.wasm)  # a bad module fails the run now, not the model's first call

    def __contains__(self, name: object) -> bool:
        return name in self.specs

    def tool_specs(self) -> dict[str, ToolSpec]:
        """The tools as the model is shown them."""
        return {name: ToolSpec(name, spec.description, spec.json_schema()) for name, spec in self.specs.items()}

    async def call(self, name: str, args: Mapping[str, Any]) -> dict[str, Any]:
        """One call, off the event loop (a call may run to its wall-clock cap)."""
        return await asyncio.to_thread(self._runner.call, self.specs[name], args)


def wasi_tools(text: str, workdir: Path) -> WasiTools | None:
    """The tools named in ``SWARMYARD_WASI_TOOLS`` (a JSON list of specs), folders and relative modules taken
    from ``workdir``; ``None`` when there are none."""
    if not text:
        return None
    from swarmyard.wasi.catalog import WasiToolSpec  # loaded by the agents given WASI tools alone

    try:
        raw = json.loads(text)
        specs = [WasiToolSpec.from_dict(item) for item in raw]
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"is not a list of WASI tool specs: {exc}", field="SWARMYARD_WASI_TOOLS") from None
    specs = [replace(s, wasm=workdir / s.wasm, folder=workdir / s.folder) for s in specs]
    return WasiTools(specs) if specs else None


def offered(base: Mapping[str, ToolSpec], profile: str, wasi: WasiTools | None) -> dict[str, ToolSpec]:
    """The tools the model is shown: ``base`` less the machine's own under ``governed``, plus the WASI tools."""
    tools = {name: spec for name, spec in base.items() if profile != GOVERNED or name not in MACHINE_TOOLS}
    return tools | (wasi.tool_specs() if wasi is not None else {})


def known(wasi: WasiTools | None, profile: str = FULL) -> dict[str, ToolSpec]:
    """Every tool a reply may name: a name outside the profile parses, and is then refused by name. Under
    ``governed`` the machine's tools parse whatever their arguments (none is required), so a call for ``shell``
    is answered ``tool_refused``, never told what ``shell`` needs."""
    tools = dict(TOOLS)
    if profile == GOVERNED:
        for name in MACHINE_TOOLS:
            tools[name] = ToolSpec(name, tools[name].description, {"type": "object", "properties": {}})
    return tools | (wasi.tool_specs() if wasi is not None else {})
