"""The built-in agent runs in every machine: what it imports is paid for by each of them, in memory and CPU.

``python -m swarmyard.agent`` (here without its environment, so it stops at once with a config error) must not
import the plane's request models (pydantic) nor httpx's command line (click, rich, pygments).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

#: Runs the agent as ``python -m swarmyard.agent`` does, then prints the packages it imported.
_PROBE = (
    "import atexit, json, runpy, sys\n"
    "atexit.register(lambda: print(json.dumps(sorted({k.split('.')[0] for k, v in sys.modules.items() if v}))))\n"
    "runpy.run_module('swarmyard.agent', run_name='__main__', alter_sys=True)\n"
)


def test_the_agent_imports_neither_pydantic_nor_httpx_command_line() -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1 and "SWARMYARD_PLANE_URL" in done.stderr, done.stderr  # stopped: no environment
    imported = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert {"swarmyard", "httpx"} <= imported  # the probe saw the agent's imports
    assert imported.isdisjoint({"pydantic", "pydantic_core", "click", "rich", "pygments"}), sorted(imported)
