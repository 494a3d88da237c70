"""``plan = N``: reading a planner's answer and the fallback lenses that fill what it could not give."""

from __future__ import annotations

import json

import pytest

from swarmyard.agents.planner import PLAN_TOOL, parse_plan, plan_tool
from swarmyard.errors import InvalidInputError
from swarmyard.swarm.planning import FALLBACK_LENSES, fallback_lenses, lenses_from_plan


def _plan(*titles: str) -> str:
    return json.dumps({"lenses": [{"title": t, "prompt": f"look at {t}"} for t in titles]})


def test_the_tool_asks_for_exactly_n_lenses() -> None:
    spec = plan_tool(4)
    assert spec.name == PLAN_TOOL
    lenses = spec.parameters["properties"]["lenses"]
    assert (lenses["minItems"], lenses["maxItems"]) == (4, 4)
    assert lenses["items"]["required"] == ["title", "prompt"]


def test_a_good_plan_is_taken_as_is() -> None:
    assert lenses_from_plan(_plan("market", "models", "risks"), 3) == [
        ("market", "look at market"), ("models", "look at models"), ("risks", "look at risks")]


def test_parse_drops_duplicates_blank_titles_and_extra_items() -> None:
    text = json.dumps({"lenses": [{"title": "A"}, {"title": " a "}, {"title": ""}, "junk", {"title": "B"},
                                  {"title": "C"}]})
    assert [(lens.title, lens.prompt) for lens in parse_plan(text, 2)] == [("A", "A"), ("B", "B")]
    assert parse_plan('[{"title": "x", "prompt": "y"}]', 1)[0].title == "x"


@pytest.mark.parametrize("body", ["I think you should look at the market.", '{"lenses": []}', '{"plan": 3}',
                                  '{"lenses": [{"title": ""}]}'])
def test_unusable_answers_are_refused(body: str) -> None:
    with pytest.raises((InvalidInputError, ValueError)):
        parse_plan(body, 3)


@pytest.mark.parametrize("body", [None, "", "prose, no JSON", '{"lenses": "nope"}'])
def test_an_unusable_plan_falls_back_to_the_fixed_lenses(body: str | None) -> None:
    got = lenses_from_plan(body, 3)
    assert [t for t, _ in got] == [t for t, _ in FALLBACK_LENSES[:3]]
    assert all("fallback" in p for _, p in got)


def test_a_short_plan_is_filled_without_repeating_its_titles() -> None:
    got = lenses_from_plan(_plan("Risks", "pricing"), 4)
    assert [t for t, _ in got] == ["Risks", "pricing", "evidence", "alternatives"]


def test_more_lenses_than_the_fixed_list_are_numbered() -> None:
    titles = [t for t, _ in fallback_lenses(len(FALLBACK_LENSES) + 2)]
    assert len(set(titles)) == len(titles)
    assert titles[len(FALLBACK_LENSES)] == f"{FALLBACK_LENSES[0][0]} 2"
