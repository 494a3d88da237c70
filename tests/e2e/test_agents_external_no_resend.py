"""External agent CLIs do not resend a call the broker answered ``upstream_unknown`` (``x-should-retry: false``).

Each CLI runs through the runner's own launcher in a ``local`` machine, pointed at the broker through the
in-sandbox relay, as in ``test_agents_external``. The scripted provider (the stand-in for a paid one) takes the
first request it is sent, records it, and loses its answer after the request left: the broker marks the hold
``unknown`` and answers 502 ``upstream_unknown`` with ``x-should-retry: false``. Whatever the CLI does next, it
must not send that same request again (a second hold, and a second bill, for one call).

Claude Code honours the header (the Anthropic SDK reads it). Codex reads no such header: its adapter turns its
request and stream retries off. pi's own auto-retry matches "502" in the error text: its adapter turns it off
(the OpenAI SDK under it, which honours the header, still retries what the broker marks retryable). opencode
(the AI SDK's retry, which takes any 5xx as retryable) and aider (its own loop, retrying for up to 60 s) resend,
and neither has a setting that stops it: for them the broker refuses the very body of a call whose hold is
``unknown`` (409 ``duplicate_of_unknown``), holding and sending nothing, so for every CLI the lost call reached
the provider once and left one ``unknown`` hold.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from external_agent_rig import MODEL, assert_installed, run_one_worker, swarm_file

from swarmyard.broker.chat import ChatRequest
from swarmyard.broker.providers.scripted import Fail, FailKind, Say, ScriptedProvider
from swarmyard.config import load_config
from swarmyard.domain import ReservationState
from swarmyard.store import open_store
from swarmyard.swarm.machine_launcher import MachineLauncher

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]


def _lose_the_first_call(short_tmp: Path, agent: str) -> tuple[ScriptedProvider, list[ReservationState]]:
    """Run one worker of ``agent`` whose first model call is lost after it left; what reached the provider,
    and the states of the holds."""
    assert_installed(agent)
    config = load_config(swarm_file(short_tmp, agent))
    run_dir = short_tmp / "runs" / "r1"
    run_dir.mkdir(parents=True)
    store = open_store(f"sqlite:///{run_dir / 'store.db'}")
    answer = "finding.md\n```\nHello.\n```\n" if agent == "aider" else "Hello, team."
    provider = ScriptedProvider({MODEL: [Fail(FailKind.AFTER_SEND)] + [Say(answer)] * 20}, name="script")
    launcher = MachineLauncher(config, store, run_dir, {"script": provider})

    try:
        run_one_worker(config, store, launcher)
        states = [r.state for g in store.list_goals() for r in store.list_reservations(g.id)]
    finally:
        store.close()
    assert provider.requests, f"{agent}'s first model request never reached the broker"
    return provider, states


def _resent(provider: ScriptedProvider) -> list[ChatRequest]:
    lost = provider.requests[0]
    return [r for r in provider.requests[1:] if r.messages == lost.messages and r.tools == lost.tools]


@pytest.mark.parametrize("agent", ["codex", "claude", "pi", "opencode", "aider"])
def test_a_lost_call_is_not_sent_again(short_tmp: Path, agent: str) -> None:
    provider, states = _lose_the_first_call(short_tmp, agent)
    assert _resent(provider) == [], f"{agent} sent the lost call {1 + len(_resent(provider))} times"
    # one hold per request that reached the provider: the lost one unknown, every other settled
    assert len(states) == len(provider.requests)
    assert states[0] is ReservationState.UNKNOWN
    assert set(states[1:]) <= {ReservationState.SETTLED}
