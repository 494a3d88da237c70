"""``python -m swarmyard.agents``: the built-in agent, run inside a worker's machine from its environment
(``SWARMYARD_PLANE_URL``, ``SWARMYARD_TOKEN``, ...)."""

import gc
import os
import sys

from swarmyard.agents.plane_route import lean_route

# Every machine's agent pays for its imports in CPU, and hundreds start at once: what it never runs is marked absent
# ("not installed" to the import system) before anything imports it. The package's __init__, run before this,
# imports none of the agent's modules.
# - httpx imports its own command line (click, rich, pygments) whenever those are installed, as they are beside
#   swarmyard's CLI: about 6 MiB and 30 ms of CPU; marked absent, httpx defines a stub instead (the agent imports
#   httpx only for a plane URL its lean client does not serve).
# - ssl: asyncio imports it where it can (about 5 ms of CPU); where the lean client serves the plane (its socket or
#   the machine's loopback relay, plain HTTP) nothing in the agent speaks TLS, and asyncio goes without it.
_absent = ["click", "rich", "pygments"]
if lean_route(os.environ.get("SWARMYARD_PLANE_URL", ""), os.environ.get("SWARMYARD_PLANE_SOCKET")) is not None:
    _absent.append("ssl")
for _unused in _absent:
    sys.modules.setdefault(_unused, None)  # type: ignore[arg-type]  # None: "not installed" to the import system

# The imports allocate a few hundred thousand objects, none of them garbage: no collection runs while they do
# (about 3 ms of CPU), and what they made is kept out of every later one.
gc.disable()
from swarmyard.agents.entry import main  # noqa: E402 - after the marks above

gc.freeze()
gc.enable()

raise SystemExit(main())
