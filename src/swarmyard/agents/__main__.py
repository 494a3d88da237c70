"""``python -m swarmyard.agents``: the built-in agent, run inside a worker's machine from its environment
(``SWARMYARD_PLANE_URL``, ``SWARMYARD_TOKEN``, ...)."""

import sys

# httpx imports its own command line (click, rich, pygments) whenever those are installed, as they are beside
# swarmyard's CLI: about 6 MiB and 30 ms of CPU in every machine's agent, which never runs it. Marked absent,
# httpx defines a stub instead. Set before anything imports httpx (the agent does only for a plane URL other
# than its machine's relay or the plane's socket; the package's __init__, run before this, does not); the agent
# itself uses none of the three.
for _unused in ("click", "rich", "pygments"):
    sys.modules.setdefault(_unused, None)  # type: ignore[arg-type]  # None: "not installed" to the import system

from swarmyard.agents.entry import main  # noqa: E402 - after the marks above

raise SystemExit(main())
