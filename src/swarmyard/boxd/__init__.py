"""A client with boxd's shape: a script written for boxd's SDK runs on swarmyard by changing its import.

::

    from swarmyard.boxd import Boxd

    boxd = Boxd()                      # no key: an embedded control plane and broker on the local model
    machine = boxd.machines.create("scout")
    boxd.machines.wait_until_ready(machine.id)
    print(boxd.machines.exec(machine.id, 'claude -p "Say hello" --dangerously-skip-permissions').stdout)
    boxd.machines.delete(machine.id)
    boxd.close()

Every machine is logged in at the broker: ``claude``, ``codex``, ``opencode``, ``pi`` and ``swarmyard-agent``
inside it reach a model with the machine's own capability token and no provider key.
"""

from swarmyard.boxd._client import AsyncBoxd, Boxd
from swarmyard.boxd._models import (
           ExecResult,
           Machine,
           MachineSource,
           MachineStatus,
           PauseResult,
           ResumeResult,
)

__all__ = ["AsyncBoxd", "Boxd", "ExecResult", "Machine", "MachineSource", "MachineStatus", "PauseResult",
           "ResumeResult"]
