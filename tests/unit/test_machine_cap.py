"""How many machines a run keeps at once: the swarm file's ``max_machines`` when it sets one, else room for every
concurrent worker and the lead (never below the documented default)."""

from __future__ import annotations

from swarmyard.config import SwarmConfig, loads_config
from swarmyard.swarm.machine_launcher import machine_cap

_BASE = """
[goal]
objective = "Count things"
budget_usd = "1"
call_cap = 10
[[tasks.lenses]]
title = "a"
[workers]
"""


def _config(workers: str) -> SwarmConfig:
    return loads_config(_BASE + workers)


def test_an_unset_cap_makes_room_for_every_concurrent_worker_and_the_lead() -> None:
    assert machine_cap(_config("count = 200\nconcurrency = 200\n")) == 202


def test_an_unset_cap_keeps_its_default_for_a_small_run() -> None:
    assert machine_cap(_config("concurrency = 4\n")) == 128


def test_a_cap_the_file_sets_is_kept_even_below_the_concurrency() -> None:
    assert machine_cap(_config("concurrency = 200\nmax_machines = 50\n")) == 50
