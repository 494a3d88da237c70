"""Claude Code, Codex and opencode as governed workers, in real governed machines (exec of anything but the CLI's
own program and runtime, and swarmyard's own interpreter for its MCP server, is refused by the sandbox, and its
writable mounts are noexec): each is started
with its own tools off, is asked by the scripted model first for its own shell tool, which it does not have, and
then for swarmyard's submit_finding over MCP, which lands in the store."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from external_agent_rig import MODEL, assert_installed, run_one_worker, swarm_file

from swarmyard.broker.providers.scripted import CallTools, Say, ScriptedProvider
from swarmyard.config import Profile, load_config
from swarmyard.errors import SandboxError
from swarmyard.store import open_store
from swarmyard.swarm.machine_launcher import MachineLauncher

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

FINDING = "Hello, team: the governed greeting is done."
#: each CLI's own shell tool as its model would call it, and what the CLI answered the model when it did
SHELL = {"claude": ("Bash", "No such tool available: Bash"), "codex": ("shell", "unsupported call: shell"),
         "opencode": ("bash", "unavailable tool 'bash'")}


@pytest.mark.parametrize("agent", sorted(SHELL))
def test_a_governed_cli_has_no_shell_and_submits_over_mcp(short_tmp: Path, agent: str) -> None:
    assert_installed(agent)
    path = swarm_file(short_tmp, agent)
    path.write_text(path.read_text().replace("[workers]\n", '[workers]\nprofile = "governed"\n'))
    config = load_config(path)
    assert config.workers.profile is Profile.GOVERNED
    run_dir = short_tmp / "runs" / "r1"
    run_dir.mkdir(parents=True)
    store = open_store(f"sqlite:///{run_dir / 'store.db'}")
    provider = ScriptedProvider({MODEL: [
        CallTools(((SHELL[agent][0], {"command": "echo escaped > /machine/escaped"}),)),
        CallTools((("*submit_finding", {"title": "greeting", "body": FINDING}),)),
        Say("Submitted."),
    ]}, name="script")
    launcher = MachineLauncher(config, store, run_dir, {"script": provider})

    try:
        span = run_one_worker(config, store, launcher)
        assert span.ending == "done", (span, [p.read_text()[-3000:] for p in (run_dir / "agents").iterdir()])
        (finding,) = [f for g in store.list_goals() for f in store.read_findings(g.id)]
        assert finding.body == FINDING
        # the shell call went back to the model as the CLI's own refusal: it has no such tool
        assert SHELL[agent][1] in str(provider.requests[1].messages[-1].content)
        assert FINDING in str(provider.requests[2].messages[-1].content)  # the MCP call's result
    finally:
        store.close()


#: programs each CLI's package (at the versions scripts/test installs) carries besides the one it runs
VENDORED = {"claude": set(), "codex": {"rg", "bwrap", "codex-code-mode-host", "codex-voice-host"},
            "opencode": {"opencode"}}


def _programs_beneath(folder: Path) -> list[Path]:
    """The executable ELF programs (not shared libraries) in an npm package folder."""
    found = []
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink() and ".so" not in path.name and os.access(path, os.X_OK):
            with path.open("rb") as f:
                if f.read(4) == b"\x7fELF":
                    found.append(path)
    return found


@pytest.mark.parametrize("agent", sorted(SHELL))
def test_a_governed_cli_machine_executes_its_program_and_nothing_else_its_package_vendors(
        short_tmp: Path, agent: str) -> None:
    from swarmyard.agents.builtin import Role
    from swarmyard.machines import Machines
    from swarmyard.machines.local import LocalBackend
    from swarmyard.swarm import governance

    assert_installed(agent)
    path = swarm_file(short_tmp, agent)
    path.write_text(path.read_text().replace("[workers]\n", '[workers]\nprofile = "governed"\n'))
    isolation = governance.isolation(load_config(path), Role.WORKER)
    assert isolation is not None
    found = shutil.which(agent, path=governance.CLI_PATH)
    assert found is not None
    package = Path(os.path.realpath(found)).parent
    while not (package / "package.json").is_file():
        package = package.parent
    # Landlock's rule is on the file, not its name: a hard link of the CLI's program (the package's copy under
    # node_modules) is that program
    allowed = {(st.st_dev, st.st_ino) for st in (os.stat(p) for p in isolation.exec_only)}
    vendored = [p for p in _programs_beneath(package) if (p.stat().st_dev, p.stat().st_ino) not in allowed]
    # Codex's ripgrep, bwrap and helper hosts; opencode's build for older CPUs; Claude Code's only copy is a link
    assert {p.name for p in vendored} >= VENDORED[agent]
    with Machines(LocalBackend(short_tmp / "m")) as machines:
        info = machines.wait_until_ready(machines.create("cli", isolation=isolation).id)
        # the CLI starts as the launcher starts it: by its name on the machine's PATH
        ran = machines.exec(info.id, [agent, "--version"], timeout=120,
                            env={"PATH": governance.CLI_PATH, "HOME": "/machine"})
        assert ran.exit_code == 0 and ran.stdout.strip(), (ran.stdout, ran.stderr)
        for program in vendored:
            with pytest.raises(SandboxError, match="Permission denied"):
                machines.exec(info.id, [str(program), "--version"], timeout=60)
