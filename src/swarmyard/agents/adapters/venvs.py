"""Agent CLIs from PyPI in environments of their own, seen inside machines through a baseline.

Some agent CLIs pin exact versions of libraries swarmyard also uses (aider-chat pins openai, pydantic, ...), so
they cannot share swarmyard's environment. Each gets a virtual environment of the same interpreter, made once
under the user's cache folder (``python -m swarmyard.agents.adapters.venvs aider`` makes it; a run never
downloads anything). The folder holding it is frozen as a machine baseline, so every machine created from that
baseline has the environment in its own home, read from a shared lower layer rather than copied per machine.

Inside a machine the environment is run as ``<home>/<folder>/bin/python -m <module>``: its ``bin/python`` is a
symlink to this interpreter, which the sandbox already binds read-only at its own path, while the console
scripts' ``#!`` lines name the host folder the environment was made in, which the machine does not have.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from swarmyard.errors import ConfigError, SandboxError, UserError


@dataclass(frozen=True, slots=True)
class AgentVenv:
    """One PyPI agent: the pinned requirement, the module ``python -m`` runs, the folder it lives in."""

    agent: str
    requirement: str  # "aider-chat==0.86.2": the package pins its own dependencies exactly
    module: str

    @property
    def version(self) -> str:
        """The pinned version (the part after ``==``)."""
        return self.requirement.partition("==")[2]

    @property
    def folder(self) -> str:
        """The environment's folder inside the baseline, and so inside every machine's home."""
        return f".{self.agent}-venv"

    @property
    def baseline(self) -> str:
        """The machine baseline's name: a new pin, or another interpreter, is a new baseline, never an old one
        reused (an environment's ``bin/python`` links to the interpreter it was made with, and a machine sees
        only the interpreter that runs swarmyard)."""
        return f"agent-{self.agent}-{self.version}-{_interpreter_tag()}"

    def python_in(self, home: str) -> str:
        """The environment's interpreter as a machine whose home is ``home`` sees it."""
        return f"{home}/{self.folder}/bin/python"


def _interpreter_tag() -> str:
    base = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    digest = hashlib.sha256(f"{base}|{sys.version}".encode()).hexdigest()[:8]
    return f"py{sys.version_info.major}{sys.version_info.minor}-{digest}"


def cache_root() -> Path:
    """Where agent environments are kept: ``$XDG_CACHE_HOME/swarmyard/agents`` (``~/.cache`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "swarmyard" / "agents"


def source_dir(spec: AgentVenv) -> Path:
    """The folder frozen as the baseline: it holds the environment under ``spec.folder``."""
    return cache_root() / spec.baseline


def installed(spec: AgentVenv) -> bool:
    """Whether the environment exists and its interpreter runs (a half-made one is never in place)."""
    return (source_dir(spec) / spec.folder / "bin" / "python").exists()


def require(spec: AgentVenv) -> Path:
    """The baseline source folder, or ``ConfigError`` saying the one command that makes it."""
    if not installed(spec):
        raise ConfigError(
            f"{spec.agent} is not installed: run `{Path(sys.executable).name} -m swarmyard.agents.adapters.venvs "
            f"{spec.agent}` once (it makes a virtual environment with {spec.requirement} in {source_dir(spec)})",
            field="workers.agent",
        )
    return source_dir(spec)


def install(spec: AgentVenv) -> Path:
    """Make the environment (idempotent): a fresh venv, pip install of the pin, then one rename into place."""
    target = source_dir(spec)
    if installed(spec):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{spec.baseline}.", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it 0700: the machine's own user must be able to read the baseline
    venv = staging / spec.folder
    # Never the caller's environment: a VIRTUAL_ENV or PYTHONPATH of the shell must not leak into the install.
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(Path.home()), "LANG": "C.UTF-8"}
    for key in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_CERT", "PIP_FIND_LINKS",
                "XDG_CACHE_HOME", "http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"):
        if key in os.environ:
            env[key] = os.environ[key]  # the host's registry settings, so the install reaches the same index
    try:
        for argv in (
            [sys.executable, "-m", "venv", str(venv)],
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
             "--no-input", spec.requirement],
        ):
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SandboxError(f"installing {spec.requirement} failed ({' '.join(argv[:3])} ...): "
                                   f"{done.stderr.strip()[-800:]}")
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _main(argv: list[str]) -> int:
    from swarmyard.agents.adapters import get_adapter

    if len(argv) != 1:
        print("usage: python -m swarmyard.agents.adapters.venvs AGENT", file=sys.stderr)
        return 2
    spec = getattr(get_adapter(argv[0]), "venv", None)
    if spec is None:
        raise UserError(f"agent {argv[0]!r} does not install from PyPI into an environment of its own")
    print(install(spec))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
