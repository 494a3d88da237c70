"""The built-in agent runs in every machine: what it imports is paid for by each of them, in memory and CPU.

``python -m swarmyard.agents`` (here without its environment, so it stops at once with a config error) must not
import the plane's request models (pydantic), httpx (it reaches the plane through its relay or socket with the lean
client of ``swarmyard.plane.lean_client``) and what httpx brings (httpcore, h11, h2, anyio, idna, ``email`` and
``http`` of the standard library), nor the plane's own server, store and CLI packages.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

#: Runs the agent as ``python -m swarmyard.agents`` does, then prints the modules it imported.
_PROBE = (
    "import atexit, json, runpy, sys\n"
    "atexit.register(lambda: print(json.dumps(sorted(k for k, v in sys.modules.items() if v))))\n"
    "runpy.run_module('swarmyard.agents', run_name='__main__', alter_sys=True)\n"
)


#: Packages the agent does not run: each would be paid for at every machine's start.
_NOT_AT_START = {"pydantic", "pydantic_core", "click", "rich", "pygments", "typer", "httpx", "httpcore", "h11", "h2",
                 "anyio", "sniffio", "idna", "email", "http", "starlette", "uvicorn", "cryptography", "sqlite3",
                 "psycopg", "yaml", "tomllib"}


def test_the_agent_imports_neither_pydantic_nor_httpx() -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1 and "SWARMYARD_PLANE_URL" in done.stderr, done.stderr  # stopped: no environment
    modules = set(json.loads(done.stdout.strip().splitlines()[-1]))
    imported = {name.split(".")[0] for name in modules}
    assert {"swarmyard", "asyncio", "httptools"} <= imported  # the probe saw the agent's imports
    assert imported.isdisjoint(_NOT_AT_START), sorted(imported & _NOT_AT_START)
    # httpx's transport, the replicas' failover, the planner and the lead's verdicts are loaded only by the agents
    # that use them
    assert modules.isdisjoint({"swarmyard.plane.transport", "swarmyard.plane.failover", "swarmyard.agents.planner",
                               "swarmyard.agents.verdicts"})
    # nor the nouns only the host side uses (goals, claims, reservations, ...): their classes are built at import
    assert "swarmyard.domain.shared" in modules and "swarmyard.domain.host" not in modules


def _started(env: dict[str, str]) -> set[str]:
    """The modules ``python -m swarmyard.agents`` imported before it stopped (no token: a config error)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", **env}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1 and "SWARMYARD_TOKEN" in done.stderr, done.stderr  # stopped after its imports
    modules = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert {"swarmyard.agents.entry", "asyncio"} <= modules  # the probe saw the agent's imports
    return modules


def test_an_agent_on_its_relay_or_socket_loads_no_tls_and_no_decimal() -> None:
    # the lean client speaks plain HTTP to the machine's relay or the plane's socket: asyncio goes without ssl
    for env in ({"SWARMYARD_PLANE_URL": "http://127.0.0.1:8431"},
                {"SWARMYARD_PLANE_URL": "http://plane", "SWARMYARD_PLANE_SOCKET": "/nonexistent/plane.sock"}):
        modules = _started(env)
        assert modules.isdisjoint({"ssl", "_ssl", "decimal", "_decimal"}), sorted(modules & {"ssl", "decimal"})
        assert "swarmyard.money" not in modules  # its Decimal, for a refusal's figures only


def test_an_agent_reaching_the_plane_through_httpx_keeps_tls() -> None:
    # https, several replicas or a path: httpx serves them, with TLS where the URL asks for it
    for url in ("https://plane.example:8443", "http://127.0.0.1:1,http://127.0.0.1:2", "http://127.0.0.1:8431/p"):
        assert "ssl" in _started({"SWARMYARD_PLANE_URL": url}), url


def test_a_full_agent_without_wasi_tools_loads_neither_seccomp_nor_wasi() -> None:
    # the exec lock is a governed agent's, the WASI runtime an agent's given WASI tools: each at its start, not all
    probe = ("import json, sys\nfrom pathlib import Path\nfrom swarmyard.agents import governed\n"
             "governed.lock('full', 'agent')\nassert governed.wasi_tools('', Path('.')) is None\n"
             "print(json.dumps(sorted(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr
    modules = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert "swarmyard.agents.governed" in modules
    assert modules.isdisjoint({"swarmyard.guest.seccomp", "swarmyard.wasi", "swarmyard.wasi.catalog"})
