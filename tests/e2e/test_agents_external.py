"""External agent CLIs in real sandboxes: their first model request reaches the broker with the worker's token.

Codex, Claude Code, opencode and pi install from the npm registry; aider from PyPI into an environment of its own
(``aider-chat`` pins exact versions of libraries this project also uses), which machines see through a baseline.
``scripts/test`` installs all five; this test finds aider's environment the way the runner does. Each runs
through the runner's own launcher in a ``local`` machine, pointed at the broker through the in-sandbox relay,
with the worker's capability token as its only key. The scripted provider records what reached it; the ledger names
the worker whose token paid. A provider key planted in the host's environment must appear nowhere the agent
could see it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from external_agent_rig import MODEL, assert_installed, run_one_worker, swarm_file

from swarmyard.broker.providers.scripted import Say, ScriptedProvider
from swarmyard.config import load_config
from swarmyard.store import open_store
from swarmyard.swarm.machine_launcher import MachineLauncher
from swarmyard.swarm.setup import create_goal

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]


PLANTED = "sk-host-key-that-must-never-reach-a-sandbox-0123456789"
FINDING = "Hello, team: the greeting is done."


@pytest.mark.parametrize("agent", ["codex", "claude", "opencode", "pi", "aider"])
def test_first_request_reaches_the_broker_with_the_worker_token(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, agent: str
) -> None:
    assert_installed(agent)
    monkeypatch.setenv("OPENAI_API_KEY", PLANTED)
    monkeypatch.setenv("ANTHROPIC_API_KEY", PLANTED)
    config = load_config(swarm_file(short_tmp, agent))
    run_dir = short_tmp / "runs" / "r1"
    run_dir.mkdir(parents=True)
    store = open_store(f"sqlite:///{run_dir / 'store.db'}")
    # aider speaks no MCP: its answer is an edit of finding.md (aider's whole-file format for an unknown model),
    # which the launcher submits as the worker's finding
    answer = f"finding.md\n```\n{FINDING}\n```\n" if agent == "aider" else "Hello, team."
    provider = ScriptedProvider({MODEL: [Say(answer)] * 20}, name="script")
    launcher = MachineLauncher(config, store, run_dir, {"script": provider})

    try:
        run_one_worker(config, store, launcher)
        assert provider.requests, f"{agent}'s first model request never reached the broker"
        reservations = [r for g in store.list_goals() for r in store.list_reservations(g.id)]
        assert reservations, "the broker admitted no call"
        workers = {w.id for g in store.list_goals() for w in store.list_workers(g.id)}
        assert {r.worker_id for r in reservations} <= workers  # paid by the worker's token, nobody else's
        # The planted key is nowhere the agent could have read it: not in what reached the provider, not in
        # the files the launcher wrote into the machine (its disk lives under the run's machines folder).
        assert all(PLANTED not in repr(r) for r in provider.requests)
        if agent == "aider":
            (finding,) = [f for g in store.list_goals() for f in store.read_findings(g.id)]
            assert finding.body == FINDING and finding.author in workers
    finally:
        store.close()
    for path in Path(run_dir).rglob("*"):
        if path.is_file() and path.stat().st_size < 1_000_000:
            assert PLANTED.encode() not in path.read_bytes(), path


def test_aider_with_another_baseline_is_refused_before_any_machine(short_tmp: Path) -> None:
    """A machine has one baseline: aider's environment and a repo baseline cannot both be given (yet)."""
    from swarmyard.errors import ConfigError

    path = swarm_file(short_tmp, "aider")
    path.write_text(path.read_text().replace('agent = "aider"', 'agent = "aider"\nbaseline = "my-repo"'))
    config = load_config(path)
    run_dir = short_tmp / "runs" / "r1"
    run_dir.mkdir(parents=True)
    store = open_store(f"sqlite:///{run_dir / 'store.db'}")
    launcher = MachineLauncher(config, store, run_dir, {"script": ScriptedProvider({}, name="script")})

    async def start() -> None:
        from swarmyard.clock import SystemClock

        try:
            await launcher.start(create_goal(store, config, SystemClock()))
        finally:
            await launcher.close()

    try:
        with pytest.raises(ConfigError, match=r"workers\.baseline"):
            asyncio.run(start())
    finally:
        store.close()


#: How each CLI submits what the scripted model decided: the swarmyard MCP tool under the name the CLI gives it,
#: or (pi, no MCP) its own write tool into the finding file the launcher submits.
SUBMIT = {
    "claude": ("*submit_finding", {"title": "greeting", "body": FINDING}),
    "codex": ("*submit_finding", {"title": "greeting", "body": FINDING}),
    "opencode": ("*submit_finding", {"title": "greeting", "body": FINDING}),
    "pi": ("write", {"path": "finding.md", "content": FINDING}),
}


@pytest.mark.parametrize("agent", sorted(SUBMIT))
def test_the_agent_works_its_task_to_a_submitted_finding(short_tmp: Path, agent: str) -> None:
    """The whole task in the CLI's own API format (Anthropic Messages, Responses, chat completions): the model
    calls a tool, the CLI runs it, the finding lands in the store under the worker's name, the CLI ends."""
    from swarmyard.broker.providers.scripted import CallTools

    assert_installed(agent)
    config = load_config(swarm_file(short_tmp, agent))
    run_dir = short_tmp / "runs" / "r1"
    run_dir.mkdir(parents=True)
    store = open_store(f"sqlite:///{run_dir / 'store.db'}")
    provider = ScriptedProvider({MODEL: [CallTools((SUBMIT[agent],)), Say("Submitted.")]}, name="script")
    launcher = MachineLauncher(config, store, run_dir, {"script": provider})

    try:
        span = run_one_worker(config, store, launcher)
        assert span.ending == "done", (span, [p.read_text()[-3000:] for p in (run_dir / "agents").iterdir()])
        assert len(provider.requests) == 2, [r.messages[-1].content[:200] for r in provider.requests]
        (finding,) = [f for g in store.list_goals() for f in store.read_findings(g.id)]
        workers = {w.id for g in store.list_goals() for w in store.list_workers(g.id)}
        assert finding.body == FINDING and finding.author in workers
        # the tool's result went back to the model in the second request: the CLI ran the call it was given
        assert len(provider.requests[1].messages) > len(provider.requests[0].messages)
        if agent in ("claude", "codex"):  # their own session transcript is kept beside the log
            [transcript] = (run_dir / "agents").glob("worker-0-*.transcript.jsonl")
            lines = [json.loads(line) for line in transcript.read_text().splitlines() if line.strip()]
            assert lines and FINDING in transcript.read_text()
    finally:
        store.close()
