"""Swarm files: the example parses, and every kind of bad file is one ConfigError naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarmyard.config import AgentKind, PolicyKind, ProviderKind, load_config, loads_config
from swarmyard.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

MINIMAL = '[goal]\nobjective = "x"\nbudget_usd = "1.25"\n[tasks]\nplan = 2\n'
BUDGET = '[goal]\nobjective = "x"\nbudget_usd = {}\n[tasks]\nplan = 2\n'


def test_three_scouts_example_parses() -> None:
    config = load_config(EXAMPLES / "three-scouts.toml")
    assert config.goal.budget_micro_usd == 500_000
    assert [lens.title for lens in config.tasks.lenses] == ["the provider key", "the budget", "the sandbox"]
    # the scouts' sources ship with the example, and their findings must cite them
    assert config.tasks.cite_files and all(Path(f).is_dir() for lens in config.tasks.lenses for f in lens.files)
    assert config.task_count == 3
    assert config.policy.kind is PolicyKind.TEAM
    assert config.workers.agent is AgentKind.BUILTIN
    assert config.providers["local"].kind is ProviderKind.LOCAL


def test_every_example_parses() -> None:
    files = sorted(EXAMPLES.glob("*.toml"))
    assert files
    for path in files:
        assert load_config(path).goal.objective


def test_defaults_and_budget_conversion() -> None:
    config = loads_config(MINIMAL)
    assert config.goal.budget_micro_usd == 1_250_000
    assert config.task_count == 2
    assert config.policy.kind is PolicyKind.TEAM
    assert config.policy.patience == 3
    assert set(config.providers) == {"local"}
    assert config.run.sandbox == "local"


def test_integer_budget_and_policy_shorthand() -> None:
    config = loads_config('policy = "explore"\n[goal]\nobjective = "x"\nbudget_usd = 2\n[tasks]\nplan = 1\n')
    assert config.goal.budget_micro_usd == 2_000_000
    assert config.policy.kind is PolicyKind.EXPLORE


def test_models_are_frozen() -> None:
    config = loads_config(MINIMAL)
    with pytest.raises(Exception, match="frozen"):
        config.goal.call_cap = 5  # type: ignore[misc]


def test_providers_table() -> None:
    config = loads_config(MINIMAL + '[workers]\nmodel = "m"\n[lead]\nmodel = "m"\n'
                          '[providers.vllm]\nkind = "openai_compatible"\n'
                          'base_url = "http://127.0.0.1:8000/v1"\nmodels = ["m"]\n'
                          '[providers.vllm.prices.m]\ninput_usd_per_mtok = "0.1"\noutput_usd_per_mtok = "0.2"\n'
                          '[providers.oai]\nkind = "openai"\napi_key_env = "OPENAI_API_KEY"\n')
    assert config.providers["vllm"].base_url == "http://127.0.0.1:8000/v1"
    assert config.providers["vllm"].terms("m").output_per_mtok == 200_000
    assert config.providers["oai"].api_key_env == "OPENAI_API_KEY"


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ('[tasks]\nplan = 2\n', "goal", "required"),
        ('[goal]\nbudget_usd = "1"\n[tasks]\nplan = 2\n', "goal.objective", "required"),
        ('[goal]\nobjective = "x"\n[tasks]\nplan = 2\n', "goal.budget_usd", "required"),
        (BUDGET.format('"-1"'), "goal.budget_usd", "ASCII digits"),
        (BUDGET.format('"0"'), "goal.budget_usd", "more than zero"),
        (BUDGET.format('0.5'), "goal.budget_usd", "decimal string"),
        (BUDGET.format('"lots"'), "goal.budget_usd", "ASCII digits"),
        (MINIMAL.replace("[tasks]", 'call_cap = "ten"\n[tasks]'), "goal.call_cap", "integer"),
        (MINIMAL.replace("[tasks]", "call_cap = -3\n[tasks]"), "goal.call_cap", "greater than 0"),
        (MINIMAL + '[policy]\nkind = "swarmiest"\n', "policy.kind", "independent"),
        (MINIMAL + '[workers]\nagent = "hal9000"\n', "workers.agent", "builtin"),
        (MINIMAL + '[workers]\ncount = "3"\n', "workers.count", "integer"),
        (MINIMAL + '[workers]\ncont = 3\n', "workers.cont", "not a known setting"),
        ('[goal]\nobjective = "x"\nbudget_usd = "1"\n', "tasks", "lenses"),
        (MINIMAL.replace("plan = 2", 'plan = 2\nlenses = [{title = "a"}]'), "tasks", "not both"),
        (MINIMAL + '[providers.x]\nkind = "openai_compatible"\n', "providers.x", "base_url"),
        (MINIMAL + '[providers.x]\nkind = "carrier-pigeon"\n', "providers.x.kind", "openai"),
        ("[goal\n", "swarm file", "TOML"),
    ],
)
def test_bad_files_name_the_field(text: str, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        loads_config(text)
    assert info.value.field == field
    assert words in info.value.message
    assert info.value.message.startswith(f"{field}: ")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such swarm file"):
        load_config(tmp_path / "nope.toml")


def test_an_evaluator_bundle_is_found_from_the_swarm_file_and_loaded(tmp_path: Path) -> None:
    import shutil

    shutil.copytree(EXAMPLES / "bundles" / "sort-numbers", tmp_path / "bundles" / "sorter")
    (tmp_path / "conf").mkdir()
    swarm = tmp_path / "conf" / "swarm.toml"
    swarm.write_text(MINIMAL + '[evaluator]\nbundle = "../bundles/sorter"\n')
    config = load_config(swarm)
    assert config.evaluator is not None
    assert config.evaluator.bundle_path == (tmp_path / "bundles" / "sorter").resolve()
    assert loads_config(MINIMAL).evaluator is None


@pytest.mark.parametrize(
    ("setup", "words"),
    [
        (lambda root: None, "is not a folder"),
        (lambda root: root.mkdir(), "evaluator.toml: missing"),
        (lambda root: (root.mkdir(), (root / "evaluator.toml").write_text('name = "x"\n')), "scoring"),
    ],
)
def test_a_missing_or_bad_bundle_is_a_config_error(tmp_path: Path, setup: object, words: str) -> None:
    assert callable(setup)
    setup(tmp_path / "bundle")
    (tmp_path / "swarm.toml").write_text(MINIMAL + '[evaluator]\nbundle = "bundle"\n')
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "swarm.toml")
    assert info.value.field == "evaluator.bundle"
    assert words in info.value.message and "bad bundle" in info.value.message
