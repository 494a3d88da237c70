"""Which files a task's findings are checked against: its lens's, and for a task delegated from one, the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarmyard.clock import FakeClock
from swarmyard.config import Lens
from swarmyard.domain import Citation, CitationKind, GoalSpec, TaskSpec
from swarmyard.errors import UnverifiedCitationError
from swarmyard.plane.sources import check
from swarmyard.store import open_store
from swarmyard.swarm.sources import LensSources, lens_of_task


def test_a_task_delegated_from_a_lens_task_has_its_sources_and_must_cite_them(tmp_path: Path) -> None:
    # Before, a subtask's title matched no lens, so it had no sources: its findings needed no citation at all
    # and its machine got none of its parent's files.
    (tmp_path / "keys.md").write_text("The broker keeps the provider key; agents never see it.\n")
    lenses = [Lens(title="keys", files=(str(tmp_path / "keys.md"),)), Lens(title="free")]
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}", clock=FakeClock())
    try:
        goal = store.create_goal(GoalSpec("g", budget_micro_usd=1_000, call_cap=10))
        keys = store.create_task(goal.id, TaskSpec("keys", budget_micro_usd=500, call_cap=5))
        lead = store.create_task(goal.id, TaskSpec("synthesis", budget_micro_usd=100, call_cap=1))
        claim = store.claim(goal.id, "w1", 60, task_id=keys.id)
        assert claim is not None
        child = store.delegate(keys.id, claim.token, TaskSpec("key follow-up", budget_micro_usd=100, call_cap=2))
        child_claim = store.claim(goal.id, "w2", 60, task_id=child.id)
        assert child_claim is not None
        grandchild = store.delegate(child.id, child_claim.token, TaskSpec("deeper", budget_micro_usd=10,
                                                                          call_cap=1))

        assert lens_of_task(lenses, store.get_task(grandchild.id), store.get_task) is lenses[0]
        assert lens_of_task(lenses, lead, store.get_task) is None  # the lead cites findings, not files
        sources = LensSources(lenses, store.get_task)
        with pytest.raises(UnverifiedCitationError, match="cites at least one source line"):
            check(sources, store.get_task(child.id), (), body="The worker keeps the provider key in plain text.")
        made_up = (Citation(CitationKind.SOURCE, "keys.md:1", "the provider key is copied into each sandbox"),)
        with pytest.raises(UnverifiedCitationError, match="does not hold the quoted words"):
            check(sources, store.get_task(child.id), made_up, body="No: the key is copied.")
        borne_out = (Citation(CitationKind.SOURCE, "keys.md:1", "The broker keeps the provider key"),)
        check(sources, store.get_task(grandchild.id), borne_out, body="Yes: the broker keeps the key.")
        check(sources, lead, (), body="a lead's synthesis cites findings")  # no sources: nothing to check here
    finally:
        store.close()


def test_a_task_with_sources_quotes_only_source_lines(tmp_path: Path) -> None:
    # A quote on a post or finding citation was stored unchecked, and the report printed it like a checked one.
    (tmp_path / "keys.md").write_text("The broker keeps the provider key; agents never see it.\n")
    lenses = [Lens(title="keys", files=(str(tmp_path / "keys.md"),))]
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}", clock=FakeClock())
    try:
        goal = store.create_goal(GoalSpec("g", budget_micro_usd=1_000, call_cap=10))
        task = store.create_task(goal.id, TaskSpec("keys", budget_micro_usd=500, call_cap=5))
        real = Citation(CitationKind.SOURCE, "keys.md:1", "The broker keeps the provider key")
        sources = LensSources(lenses, store.get_task)
        for kind in (CitationKind.POST, CitationKind.FINDING, CitationKind.ARTIFACT):
            said = Citation(kind, "1", "keys.md:1: The worker keeps the provider key in plain text")
            with pytest.raises(UnverifiedCitationError, match="only a source line's quote is checked"):
                check(sources, task, (real, said), body="Yes: the broker keeps the key.")
            check(sources, task, (real, Citation(kind, "1", "")), body="Yes: the broker keeps the key.")
    finally:
        store.close()
