"""What a parsed swarm file needs from this host, checked before any run folder, goal or process exists.

The file's own checks (fields, prices, the evaluator bundle, a scripted provider's replies) run when it is
parsed (``swarmyard.config``); these look at the host: the machines backend can be loaded here, and the
baseline the workers start from exists, and no lens's files hold the runs folder (or lie in it). Each problem is one ``ConfigError`` naming the field.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from swarmyard.config import AgentKind, SandboxKind, SwarmConfig
from swarmyard.errors import ConfigError

#: What each backend needs installed beyond swarmyard, and how to get it.
_NEEDS: dict[SandboxKind, tuple[str, str]] = {
    SandboxKind.RAY: ("ray", "the ray backend needs Ray: pip install 'swarmyard[ray]'"),
}


def check_host(config: SwarmConfig) -> None:
    """Raise ``ConfigError`` for the first thing ``config`` needs that this host lacks."""
    _check_sandbox(config.run.sandbox)
    _check_baseline(config)
    _check_lens_files(config)


def _check_lens_files(config: SwarmConfig) -> None:
    """A lens's files are copied into every machine that takes its task: the runs folder (this run's store,
    audit log, plane socket and agents' logs, other runs' data) must be neither among them nor hold them, as
    ``files = ["."]`` beside a swarm file run from its own folder would have it."""
    runs = Path(config.run.runs_dir).resolve()
    for index, lens in enumerate(config.tasks.lenses):
        for value in lens.files:
            path = Path(value)  # made absolute when the file was parsed
            if path == runs or path in runs.parents:
                raise ConfigError(f"{value} holds the runs folder {runs} (where runs write their store, logs and "
                                  "sockets), which is never copied into machines: name the files or folders the "
                                  "task needs, or set [run] runs_dir outside it", field=f"tasks.lenses.{index}.files")
            if runs in path.parents:
                raise ConfigError(f"{value} is in the runs folder {runs}, whose files runs write while they go: "
                                  "copy what the task needs out of it first", field=f"tasks.lenses.{index}.files")


def _check_sandbox(kind: SandboxKind) -> None:
    from swarmyard.machines.api import BACKENDS

    target = BACKENDS.get(kind.value)
    if target is None or importlib.util.find_spec(target.partition(":")[0]) is None:
        raise ConfigError(f"unknown sandbox {kind.value!r}: this swarmyard has {', '.join(sorted(BACKENDS))}",
                          field="run.sandbox")
    need = _NEEDS.get(kind)
    if need is not None and importlib.util.find_spec(need[0]) is None:
        raise ConfigError(need[1], field="run.sandbox")
    if kind in (SandboxKind.LOCAL, SandboxKind.RAY) and shutil.which("bwrap") is None:
        raise ConfigError("bubblewrap is not installed: apt-get install -y bubblewrap (or run with --sandbox "
                          "process, without isolation)", field="run.sandbox")


def _check_baseline(config: SwarmConfig) -> None:
    from swarmyard.agents.adapters import get_adapter

    name = config.workers.baseline
    own = sorted({kind.value for kind in (config.workers.agent, config.lead.agent)
                  if kind is not AgentKind.BUILTIN and get_adapter(kind.value).venv is not None})
    if own and (name is not None or len(own) > 1):
        # a machine has one baseline; an agent installed from PyPI is already one
        raise ConfigError(f"{', '.join(own)} run from an environment of their own, which a machine sees through "
                          "its baseline: no other baseline can be given with it yet", field="workers.baseline")
    if name is None or config.run.sandbox is SandboxKind.RAY:
        return  # a Ray node keeps its own baselines: machines.create there says when one is missing
    from swarmyard.machines.supervised import default_root

    if not (default_root() / "baselines" / name).is_dir():
        raise ConfigError(f"no baseline named {name!r} on this host (make it with Machines.prepare_baseline or "
                          "baseline_from_machine first)", field="workers.baseline")
