"""Campaign files read into cells and trials (each trial's swarm config as ``swarmyard run`` would parse it), and
the per-cell summary with the seed's sentence."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.campaign.record import TrialRecord
from swarmyard.campaign.spec import Campaign, load_campaign
from swarmyard.campaign.summary import claim_text, summarise
from swarmyard.config import HistoryMode, PolicyKind

SWARM = """
[goal]
objective = "Find instance ${seed}'s code."
budget_usd = "1"
call_cap = 99
[[tasks.lenses]]
title = "guess"
prompt = "instance ${seed}"
[workers]
model = "sim"
concurrency = 2
[lead]
model = "sim"
[providers.sim]
kind = "simulated"
models = ["sim"]
simulate = "attempts"
"""


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-cs-"))  # short: a trial's plane socket lives under the campaign's dir
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_2x2_and_the_sweep_become_cells_with_matched_trials(tmp_path: Path) -> None:
    c = load_campaign_text(tmp_path, 'seeds = [4, 7]\nbudget_usd = "0.25"\ncall_cap = 30\ndeadline_s = 90\n'
                           "[grid]\ncohort = 3\ntop_k = 2\n[sweep]\nn = [4, 1]\n")
    assert [cell.name for cell in c.cells] == [
        "single/scored_history", "cohort3/scored_history", "single/single_draft_refinement",
        "cohort3/single_draft_refinement", "best@1", "team@1", "best@4", "team@4"]
    assert len(c.trials) == 16 and c.dir == tmp_path / "campaigns" / "c"
    for trial in c.trials:
        goal = trial.config.goal
        assert (goal.budget_micro_usd, goal.call_cap, goal.deadline_s) == (250_000, 30, 90)  # one cap for all
        assert trial.config.workers.count == trial.cell.n
        shares = trial.cell.policy is not PolicyKind.INDEPENDENT and trial.cell.n > 1
        # workers who read each other are answered in turn by the seeded model, all of them at once
        assert trial.config.workers.concurrency == (trial.cell.n if shares else min(trial.cell.n, 2))
        assert trial.config.providers["sim"].turns == (trial.cell.n if shares else None)
        assert trial.config.run.runs_dir == str(c.dir / "runs")
        lenses = trial.config.tasks.lenses
        assert len(lenses) == trial.cell.n  # one problem: an attempt per worker
        assert all(lens.prompt == f"instance {trial.seed}" for lens in lenses)  # the seed is the instance
    cohort = next(t for t in c.trials if t.key == "cohort3/single_draft_refinement#7")
    assert cohort.config.policy.kind is PolicyKind.TEAM
    assert cohort.config.workers.history is HistoryMode.SINGLE_DRAFT_REFINEMENT
    assert cohort.config.workers.history_top_k == 2
    assert [lens.title for lens in cohort.config.tasks.lenses] == [f"guess (attempt {i} of 3)" for i in (1, 2, 3)]
    best = next(t for t in c.trials if t.key == "best@4#4")
    assert best.config.policy.kind is PolicyKind.INDEPENDENT
    assert best.config.workers.history is HistoryMode.NONE  # the sweep keeps the swarm file's history


def test_a_problem_of_several_lenses_is_shared_by_the_cohort(tmp_path: Path) -> None:
    swarm = SWARM.replace('[workers]', '[[tasks.lenses]]\ntitle = "second"\n[workers]')
    c = load_campaign_text(tmp_path, "seeds = [1]\n[grid]\ncohort = 2\n", swarm)
    for trial in c.trials:
        assert [lens.title for lens in trial.config.tasks.lenses] == ["guess", "second"]


def test_the_campaign_digest_follows_its_files(tmp_path: Path) -> None:
    first = load_campaign_text(tmp_path, "seeds = [1]\n[grid]\n").digest
    assert load_campaign_text(tmp_path, "seeds = [1]\n[grid]\n").digest == first
    assert load_campaign_text(tmp_path, "seeds = [1]\n[grid]\n", SWARM.replace("99", "98")).digest != first


def load_campaign_text(tmp_path: Path, campaign: str, swarm: str = SWARM) -> Campaign:
    (tmp_path / "s.toml").write_text(swarm)
    (tmp_path / "c.toml").write_text('[campaign]\nname = "c"\nswarm = "s.toml"\n' + campaign)
    return load_campaign(tmp_path / "c.toml", cwd=tmp_path)


def _rec(cell: str, seed: int, score: int | None, error: str = "") -> TrialRecord:
    return TrialRecord(f"{cell}#{seed}", cell, seed, f"run_{seed}", score, 5, 10, 100, 20, 2.0, 0.5, 2, True, error)


def test_the_summary_tests_the_seed_sentence_only_with_enough_seeds_and_counts_failures(tmp_path: Path) -> None:
    c = load_campaign_text(tmp_path, "seeds = [1, 2, 3]\n[grid]\ncohort = 2\n")
    records = [_rec("single/scored_history", s, 900 + s) for s in (1, 2, 3)]
    records += [_rec("cohort2/scored_history", s, 100 + s) for s in (1, 2, 3)]
    records += [_rec("single/single_draft_refinement", s, v) for s, v in ((1, 10), (2, 500), (3, 20))]
    records += [_rec("cohort2/single_draft_refinement", 1, 400), _rec("cohort2/single_draft_refinement", 2, None,
                                                                      "provider_error: gone")]
    summary = summarise(c, records)
    assert not summary.complete  # one trial is missing
    claims = {claim.history: claim for claim in summary.claims}
    scored = claims[HistoryMode.SCORED_HISTORY]
    # the single worker wins every seed, but 3 seeds cannot make it significant: not tested, per-seed values shown
    assert scored.verdict == "untested" and scored.comparison.test.wins == 3
    assert "per-seed differences +800, +800, +800" in claim_text(scored)
    drafts = claims[HistoryMode.SINGLE_DRAFT_REFINEMENT]
    assert drafts.comparison.seeds == (1, 2)  # the failed trial is paired as a zero, not dropped
    assert drafts.comparison.b_scores == (400.0, 0.0)
    cells = {cell["name"]: cell for cell in summary.to_dict()["cells"]}
    assert cells["cohort2/single_draft_refinement"]["failed"] == 1
    assert cells["cohort2/single_draft_refinement"]["mean"] == 200  # (400 + 0) / 2: the failure counts
    assert cells["cohort2/single_draft_refinement"]["seeds"] == [1, 2]
    assert cells["single/scored_history"]["ci_low"] <= 902 <= cells["single/scored_history"]["ci_high"]
    assert cells["single/scored_history"]["spend_micro_usd"] == 5 and cells["single/scored_history"]["calls"] == 10


def test_the_crossing_of_a_token_sweep_is_stated_from_the_signs_of_the_differences() -> None:
    from swarmyard.campaign.summary import Crossing

    significant = ("reversed", "holds", "holds")
    once = Crossing(4, ((500, -3.0), (1000, 5.0), (2000, 6.0)), significant).text
    assert "team@n loses to best@n below about 1000 tokens per agent and beats it from there on" in once
    # a side is a loss or a win only where its differences are significant: else what the means say, and where not
    weak = Crossing(4, ((500, -3.0), (1000, 5.0), (2000, 6.0)), ("not shown", "holds", "not shown")).text
    assert "loses to" not in weak and "beats" not in weak
    assert "team@n trails, on the mean only (not significant at 500), best@n below about 1000" in weak
    assert "leads, on the mean only (not significant at 2000), it from there on" in weak
    assert "changes 2 times" in Crossing(4, ((500, -3.0), (1000, 5.0), (2000, -6.0)), significant).text
    assert "no crossing" in Crossing(2, ((500, 3.0), (1000, 5.0)), ("holds", "holds")).text
    assert "beats best@n below about 1000" in Crossing(2, ((500, 3.0), (1000, -5.0)), ("holds", "reversed")).text
