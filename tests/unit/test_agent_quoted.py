"""A quoted finding and a quoted synthesis: the model's choices written by swarmyard, nothing of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarmyard.agents import quoted, verdicts
from swarmyard.agents.settings import QUOTED, AgentSettings
from swarmyard.config import FindingMode, Synthesis, load_config, loads_config
from swarmyard.errors import ConfigError, InvalidInputError
from swarmyard.rules import originality, quotes

LINE = "A call the envelopes cannot afford is refused with HTTP 402 before any request leaves."


def test_a_finding_is_the_verdict_and_the_lines_quoted_with_their_citations() -> None:
    body = quoted.finding({"verdict": "No"}, [("budget.md:3", LINE), ("keys.md:4", "A worker  never holds a key.")])
    assert body == f'No: "{LINE}" (budget.md:3); "A worker never holds a key." (keys.md:4)'
    assert quotes.spans(body) == [("budget.md:3", LINE), ("keys.md:4", "A worker never holds a key.")]
    assert quoted.verdict_of(body) == verdicts.NO


@pytest.mark.parametrize("args", [{"verdict": "maybe"}, {}, {"verdict": ""}])
def test_a_verdict_outside_the_set_is_asked_again(args: dict[str, str]) -> None:
    with pytest.raises(InvalidInputError, match="verdict must be one of yes, no, unclear"):
        quoted.finding(args, [("budget.md:3", LINE)])


def test_a_finding_without_a_line_is_asked_again() -> None:
    with pytest.raises(InvalidInputError, match="cite the line"):
        quoted.finding({"verdict": "yes"}, [])


def test_the_spec_offers_only_the_searched_lines_and_the_three_verdicts() -> None:
    params = quoted.spec(["budget.md:3: x", "budget.md:3: x", "keys.md:4: y"]).parameters
    assert params["properties"]["cite"]["items"]["enum"] == ["budget.md:3: x", "keys.md:4: y"]
    assert params["properties"]["verdict"]["enum"] == ["yes", "no"]
    assert params["required"] == ["cite", "verdict"]


@pytest.mark.parametrize(("body", "verdict"), [("No: the budget is exceeded.", "no"), ("yes, it is", "yes"),
                                               ("UNCLEAR.", "unclear"), ("Not at all", "unclear"),
                                               ("Probably yes", "unclear"), ("", "unclear")])
def test_a_findings_verdict_is_its_first_word(body: str, verdict: str) -> None:
    assert quoted.verdict_of(body) == verdict


def test_the_synthesis_is_the_tally_of_first_words_and_the_checked_lines() -> None:
    shown = [
        ("fnd_aaaaaaaa", "the budget (by w, group team)",
         f"No: the budget has been exceeded.\nCited line budget.md:3: {LINE}"),
        ("fnd_bbbbbbbb", "the key (by w, group team)", "Yes, the key is safe."),
        ("fnd_cccccccc", "the box (by w, group team)", 'Yes: "loopback only" (sandbox.md:3)\n'
                                                       "Cited line sandbox.md:3: loopback only"),
    ]
    body = quoted.synthesis("Is it safe?", shown)
    assert body == (
        "Mixed: 2 of 3 findings say yes [fnd_bbbbbbbb] [fnd_cccccccc]; 1 of 3 findings says no [fnd_aaaaaaaa].\n\n"
        'Asked "Is it safe?", the findings answer with the lines they cite:\n'
        f'- No: "{LINE}" (budget.md:3) [fnd_aaaaaaaa]\n'
        "- Yes: (it cites no line) [fnd_bbbbbbbb]\n"
        '- Yes: "loopback only" (sandbox.md:3) [fnd_cccccccc]')
    assert "exceeded" not in body and verdicts.check(body) is None


def test_a_synthesis_quoting_the_lines_its_findings_quote_copies_none_of_them() -> None:
    finding = f'Yes: "{LINE}" (budget.md:3)'
    synthesis = quoted.synthesis("Is it safe?", [("fnd_aaaaaaaa", "b", f"{finding}\nCited line budget.md:3: {LINE}")])
    assert originality.problem(synthesis, read={"fnd_aaaaaaaa": finding}) is None
    # the same words outside a quote are still a copy
    assert originality.problem(f"{LINE} [fnd_aaaaaaaa]", read={"fnd_aaaaaaaa": LINE}) is not None


def test_the_finding_mode_goes_through_the_environment() -> None:
    settings = AgentSettings(plane_url="unix:/x", token="t", model="m", finding=QUOTED, synthesis=QUOTED)
    back = AgentSettings.from_env(settings.to_env())
    assert (back.finding, back.synthesis) == (QUOTED, QUOTED)
    with pytest.raises(ConfigError):
        AgentSettings.from_env({**settings.to_env(), "SWARMYARD_FINDING": "prose"})


@pytest.mark.parametrize("table", ['[workers]\nagent = "codex"\nfinding = "quoted"',
                                   '[workers]\nattach_result = true\nfinding = "quoted"',
                                   '[lead]\nagent = "codex"\nsynthesis = "quoted"'])
def test_quoted_is_the_builtin_agents_and_said_so_before_a_run(table: str) -> None:
    with pytest.raises(ConfigError, match="quoted"):
        loads_config(f'[goal]\nobjective = "x"\nbudget_usd = 1\n{table}\n')


def test_the_demo_asks_for_quoted_findings_and_a_quoted_synthesis() -> None:
    config = load_config(Path(__file__).resolve().parents[2] / "examples" / "three-scouts.toml")
    assert config.workers.finding is FindingMode.QUOTED and config.lead.synthesis is Synthesis.QUOTED
