"""The ``process`` backend: machines are plain host processes in their own folders. NO ISOLATION: development only.

Each machine still gets its own disk folder, a clean allow-listed environment, process-group kills on timeout and
the relay to the control plane, so code written against it runs unchanged on ``local``.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

from swarmyard.errors import SandboxUnavailableError
from swarmyard.machines.environment import ENV_BIN
from swarmyard.machines.protocol import MachineSpec
from swarmyard.machines.supervised import Launch, Machine, SupervisedBackend, init_argv

_log = logging.getLogger(__name__)
WARNING = (
    "swarmyard machines: the 'process' backend gives NO isolation: commands run as you, see your files, "
    "your network and your other processes. Use it for development only."
)


class ProcessWarning(UserWarning):
    """Raised as a warning whenever an unisolated machine starts."""


class ProcessBackend(SupervisedBackend):
    """Machines as unisolated host processes."""

    name = "process"

    def __init__(self, root: Path | None = None) -> None:
        super().__init__(root)
        self._python = os.path.realpath(sys.executable)

    def sandbox_prefix(self) -> str:
        """The machine's home folder as its commands see it: a host folder."""
        return str(self.root / "m")

    def _launch(self, machine: Machine, ready_w: int) -> Launch:
        if machine.spec.isolation.exec_only:
            # a governed machine is one whose commands cannot exec a shell: this backend cannot refuse one
            raise SandboxUnavailableError("the 'process' backend cannot restrict what a machine executes "
                                          "(exec_only, a governed worker's): use the local backend")
        warnings.warn(WARNING, ProcessWarning, stacklevel=4)
        _log.warning("%s (machine %s)", WARNING, machine.info.id)
        config: dict[str, object] = {
            "ctl": str(machine.root / "ctl" / "init.sock"),
            "ready_fd": ready_w,
            "cwd": str(machine.disk.merged),
        }
        spec: MachineSpec = machine.spec
        if spec.control_socket is not None:
            config.update(relay_target=str(spec.control_socket), relay_port=0)
        return Launch(argv=init_argv(self._python, config), env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})

    def machine_env(self, machine_id: str) -> dict[str, str]:
        """The variables every machine starts with: HOME and TMPDIR are on its disk folder."""
        home = self.root / "m" / machine_id / "disk"
        path = f"{ENV_BIN}:/usr/local/bin:/usr/bin:/bin"
        return {
            "PATH": path,
            "HOME": str(home),
            "TMPDIR": str(home / ".tmp"),
            "USER": "agent",
            "SHELL": "/bin/sh",
            "LANG": "C.UTF-8",
        }
