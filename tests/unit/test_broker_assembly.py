"""The one broker assembly: every route carries the table's or the file's price; scripted replies from a file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarmyard.broker.providers.configured import build, check_table
from swarmyard.broker.providers.scripted import CallTools, Fail, FailKind, Say, ScriptedProvider
from swarmyard.broker.settings import Tokenizer
from swarmyard.config import provider_table
from swarmyard.errors import ConfigError

KEYS = {"OPENAI_API_KEY": "sk-test", "ANTHROPIC_API_KEY": "sk-ant-test"}


def test_flags_and_files_route_with_prices_and_windows(tmp_path: Path) -> None:
    file = tmp_path / "providers.toml"
    file.write_text('[providers.up]\nkind = "openai_compatible"\nbase_url = "http://127.0.0.1:9/v1"\n'
                    'models = ["house"]\n[providers.up.prices.house]\ninput_usd_per_mtok = "0.5"\n'
                    'output_usd_per_mtok = "1.5"\nmax_output_tokens = 700\ncontext_tokens = 9000\n')
    table = provider_table(file, ["oa=openai:gpt-4o-mini", "an=anthropic:claude-sonnet-4-5", "sim=simulated:s"])
    _, routes = build(table, cache_dir=tmp_path, env=KEYS)
    by_name = {r.name: r for r in routes}
    mini = by_name["gpt-4o-mini"]
    assert (mini.input_per_mtok, mini.output_per_mtok, mini.context_tokens) == (150_000, 600_000, 128_000)
    assert mini.tokenizer is Tokenizer.CL100K
    sonnet = by_name["claude-sonnet-4-5"]
    assert (sonnet.input_per_mtok, sonnet.output_per_mtok) == (3_000_000, 15_000_000)
    assert sonnet.context_tokens is None  # byte-bounded: the table's window would refuse what fits
    house = by_name["house"]
    assert (house.input_per_mtok, house.output_per_mtok) == (500_000, 1_500_000)
    assert (house.max_output_tokens, house.context_tokens) == (700, 9000)  # the file's window holds anywhere
    assert (by_name["s"].input_per_mtok, by_name["s"].output_per_mtok) == (0, 0)


def test_a_hosted_provider_needs_its_key_before_anything(tmp_path: Path) -> None:
    table = provider_table(None, ["oa=openai:gpt-4o-mini"])
    with pytest.raises(ConfigError, match="set OPENAI_API_KEY") as info:
        check_table(table, env={})
    assert info.value.field == "providers.oa.api_key_env"
    check_table(table, env=KEYS)


def test_a_scripted_provider_answers_from_its_replies_file(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text(json.dumps({
        "m": [{"say": "hello", "output_tokens": 3},
              {"tool_calls": [{"name": "board_post", "arguments": {"body": "x"}}], "text": "posting"},
              {"fail": "after_send"}],
    }))
    (tmp_path / "p.toml").write_text('[providers.s]\nkind = "scripted"\nmodels = ["m"]\nreplies = "r.json"\n')
    providers, _ = build(provider_table(tmp_path / "p.toml", []), cache_dir=tmp_path, env={})
    script = providers["s"]
    assert isinstance(script, ScriptedProvider)
    assert list(script._queues["m"]) == [Say("hello", output_tokens=3),
                                         CallTools((("board_post", {"body": "x"}),), "posting"),
                                         Fail(FailKind.AFTER_SEND)]
    with pytest.raises(ConfigError, match="needs replies = FILE"):
        build(provider_table(None, ["s=scripted:m"]), cache_dir=tmp_path, env={})
