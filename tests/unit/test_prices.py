"""Prices: the maintained table read offline, the swarm file's own values exact to the micro-USD, no float."""

from __future__ import annotations

import subprocess
import sys

import pytest

from swarmyard.config import ProviderConfig, ProviderKind, loads_config
from swarmyard.errors import ConfigError
from swarmyard.prices import known_model, usd_per_mtok_to_micro

HEAD = '[goal]\nobjective = "x"\nbudget_usd = "1"\n[tasks]\nplan = 1\n[workers]\nmodel = "{m}"\n[lead]\nmodel = "{m}"\n'


def _file(model: str, provider: str) -> str:
    return HEAD.format(m=model) + provider


def test_known_models_take_the_table_price_and_window() -> None:
    mini = known_model("openai", "gpt-4o-mini")
    assert mini is not None and (mini.input_per_mtok, mini.output_per_mtok) == (150_000, 600_000)
    assert mini.context_tokens == 128_000
    # tiered: the tier that starts at the model's window can never apply, so the base price is charged
    sonnet = known_model("anthropic", "claude-sonnet-4-5")
    assert sonnet is not None and (sonnet.input_per_mtok, sonnet.output_per_mtok) == (3_000_000, 15_000_000)
    assert known_model("openai", "no-such-model-9") is None
    # an openai_compatible route serving a known name is priced like its maker's
    assert known_model("openai_compatible", "gpt-4o-mini", "http://127.0.0.1:9/v1") == mini


def test_the_table_is_read_without_a_network() -> None:
    code = ("import socket\n"
            "def refuse(*a, **k):\n    raise OSError('no network in this test')\n"
            "socket.socket.connect = refuse\nsocket.create_connection = refuse\nsocket.getaddrinfo = refuse\n"
            "from swarmyard.prices import known_model\n"
            "print(known_model('openai', 'gpt-4.1-mini'))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "input_per_mtok=400000" in done.stdout and "output_per_mtok=1600000" in done.stdout


@pytest.mark.parametrize(("usd", "micro"), [("0.15", 150_000), ("0.000001", 1), ("12", 12_000_000), ("0", 0)])
def test_decimal_strings_convert_exactly(usd: str, micro: int) -> None:
    assert usd_per_mtok_to_micro(usd, field="p") == micro


def test_the_file_overrides_the_table_field_by_field() -> None:
    config = loads_config(_file("gpt-4o-mini", '[providers.oa]\nkind = "openai"\nmodels = ["gpt-4o-mini"]\n'
                                '[providers.oa.prices.gpt-4o-mini]\noutput_usd_per_mtok = "0.75"\n'
                                "max_output_tokens = 2000\ncontext_tokens = 64000\n"))
    terms = config.providers["oa"].terms("gpt-4o-mini")
    assert (terms.input_per_mtok, terms.output_per_mtok) == (150_000, 750_000)
    assert (terms.max_output_tokens, terms.context_tokens) == (2000, 64_000)


def test_local_simulated_and_scripted_cost_nothing_unless_set() -> None:
    free = ProviderConfig(kind=ProviderKind.SIMULATED, models=("s",))
    assert free.terms("s").input_per_mtok == free.terms("s").output_per_mtok == 0
    priced = ProviderConfig.model_validate({"kind": "simulated", "models": ["s"],
                                            "prices": {"s": {"output_usd_per_mtok": "2.5"}}})
    assert (priced.terms("s").input_per_mtok, priced.terms("s").output_per_mtok) == (0, 2_500_000)


@pytest.mark.parametrize(("provider", "words"), [
    ('[providers.oa]\nkind = "openai"\nmodels = ["m-1"]\n', "no input price is known for model 'm-1'"),
    ('[providers.v]\nkind = "openai_compatible"\nbase_url = "http://127.0.0.1:9/v1"\nmodels = ["m-1"]\n'
     '[providers.v.prices.m-1]\ninput_usd_per_mtok = "1"\n', "no output price is known for model 'm-1'"),
    ('[providers.v]\nkind = "simulated"\nmodels = ["m-1"]\n[providers.v.prices.m-1]\n'
     "input_usd_per_mtok = 0.15\n", "never a float"),
    ('[providers.v]\nkind = "simulated"\nmodels = ["m-1"]\n[providers.v.prices.m-1]\n'
     'input_usd_per_mtok = "0.0000005"\n', "six decimal places"),
    ('[providers.v]\nkind = "simulated"\nmodels = ["m-1"]\n[providers.v.prices.m-1]\n'
     'input_usd_per_mtok = "-1"\n', "ASCII digits"),
    ('[providers.v]\nkind = "simulated"\nmodels = ["m-1"]\n[providers.v.prices.m-2]\n'
     'input_usd_per_mtok = "1"\n', "not one of this provider's models"),
    ('[providers.v]\nkind = "simulated"\nmodels = ["m-1"]\n[providers.v.prices.m-1]\ncontext_tokens = 0\n',
     "greater than 0"),
])
def test_bad_prices_are_refused_naming_the_model(provider: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        loads_config(_file("m-1", provider))
    assert info.value.field is not None and info.value.field.startswith("providers.")
    assert words in info.value.message
