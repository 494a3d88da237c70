"""How the embedded model's context is shared: slots the running agent's requests fit in."""

from __future__ import annotations

import pytest

from swarmyard.broker.providers.configured import LocalSlots, slots_for
from swarmyard.errors import ConfigError


def test_the_built_in_agent_gets_four_small_slots_and_a_cli_fewer_whole_windows() -> None:
    assert slots_for({"builtin"}, 8) == LocalSlots(4, 4096)
    # Claude Code's first request is ~19,000 tokens: it needs the model's whole 32,768-token window
    assert slots_for({"claude", "builtin"}, 3) == LocalSlots(2, 32_768)
    assert slots_for({"codex"}, 1) == LocalSlots(1, 32_768)


@pytest.mark.parametrize(("count", "tokens"), [(0, 4096), (1, 100), (1, 32_769)])
def test_slots_outside_what_the_model_holds_are_refused(count: int, tokens: int) -> None:
    with pytest.raises(ConfigError, match="local slots"):
        LocalSlots(count, tokens)
