"""The built-in agent's settings, both ways: what a launcher writes with ``to_env`` the agent reads back with
``from_env``, and a bad variable is the same ``ConfigError`` naming it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from swarmyard.agents import settings as agent_settings
from swarmyard.agents.model import OutputMode
from swarmyard.agents.settings import AgentSettings, Role
from swarmyard.errors import ConfigError

#: The fields with no variable: ``from_env`` gives their defaults.
_NOT_IN_ENV = {"max_reasks", "max_retries", "retry_backoff_s"}

#: Every field carried by the environment, each not at its default.
_CHANGED = AgentSettings(
    plane_url="http://127.0.0.1:4321,http://127.0.0.1:4322",
    token="tok.en",
    model="some-model",
    role=Role.LEAD,
    max_steps=5,
    exec_timeout_s=12.5,
    workdir=Path("/machine/work"),
    mode=OutputMode.JSON_SCHEMA,
    task_id="tsk_1",
    max_tokens=77,
    plan_count=4,
    policy="explore",
    heartbeat_s=3.5,
    profile="governed",
    wasi_tools='[{"name": "grep", "wasm": "grep.wasm"}]',
    history="scored_history",
    history_top_k=6,
    synthesis="digest",
    flow=("search", "submit_finding"),
    attach_result=True,
    synthesis_artifact=True,
    finding="quoted",
)


def test_every_field_round_trips_through_the_environment() -> None:
    defaults = AgentSettings(plane_url="u", token="t", model="m")
    changed = {f.name for f in dataclasses.fields(AgentSettings)
               if getattr(_CHANGED, f.name) != getattr(defaults, f.name)}
    # the example changes every field the environment carries, so a field to_env forgot would show here
    assert changed == {f.name for f in dataclasses.fields(AgentSettings)} - _NOT_IN_ENV
    env = _CHANGED.to_env()
    assert all(name.startswith("SWARMYARD_") and isinstance(value, str) for name, value in env.items())
    assert AgentSettings.from_env(env) == _CHANGED


def test_the_defaults_round_trip() -> None:
    defaults = AgentSettings(plane_url="http://127.0.0.1:9", token="t", model=agent_settings.DEFAULT_MODEL)
    env = defaults.to_env()
    assert AgentSettings.from_env(env) == defaults
    # the optional ones are left out, as the agent reads a missing one
    assert not {"SWARMYARD_TASK_ID", "SWARMYARD_WASI_TOOLS", "SWARMYARD_FLOW", "SWARMYARD_ATTACH_RESULT",
                "SWARMYARD_SYNTHESIS_ARTIFACT", "SWARMYARD_FINDING"} & set(env)
    # and the defaults are those of an environment that names only the plane and the token
    assert AgentSettings.from_env({"SWARMYARD_PLANE_URL": "http://127.0.0.1:9", "SWARMYARD_TOKEN": "t"}) == defaults


def test_the_knobs_without_a_variable_come_back_at_their_defaults() -> None:
    tuned = dataclasses.replace(_CHANGED, max_reasks=9, max_retries=9, retry_backoff_s=9.0)
    assert AgentSettings.from_env(tuned.to_env()) == _CHANGED


@pytest.mark.parametrize(("name", "value", "field", "message"), [
    ("SWARMYARD_MAX_STEPS", "x", "SWARMYARD_MAX_STEPS", "is not a number"),
    ("SWARMYARD_HEARTBEAT_S", "soon", "SWARMYARD_HEARTBEAT_S", "is not a number"),
    ("SWARMYARD_PLANE_URL", "", "SWARMYARD_PLANE_URL", "is not set"),
    ("SWARMYARD_ROLE", "boss", "SWARMYARD_ROLE/SWARMYARD_OUTPUT_MODE", "'boss' is not a valid Role"),
    ("SWARMYARD_SYNTHESIS", "all", "SWARMYARD_SYNTHESIS", "is not free, digest or quoted"),
    ("SWARMYARD_FINDING", "prose", "SWARMYARD_FINDING", "is not free or quoted"),
    ("SWARMYARD_PROFILE", "open", "SWARMYARD_PROFILE", "is not full or governed"),
    ("SWARMYARD_HISTORY", "everything", "SWARMYARD_HISTORY",
     "is not one of none, scored_history, single_draft_refinement"),
])
def test_a_bad_variable_is_a_config_error_naming_it(name: str, value: str, field: str, message: str) -> None:
    env = {**_CHANGED.to_env(), name: value}
    with pytest.raises(ConfigError) as bad:
        AgentSettings.from_env(env)
    assert bad.value.field == field
    assert bad.value.message == f"{field}: {message}"
