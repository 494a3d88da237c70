"""A campaign's own cells (``[[cells]]``: the swarm file with some keys of its workers, lead and policy tables
replaced) and the sentences it tests (``[[claims]]``), read into trials and summarised."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.campaign.record import TrialRecord
from swarmyard.campaign.spec import Campaign, load_campaign
from swarmyard.campaign.summary import summarise
from swarmyard.config import PolicyKind
from swarmyard.errors import ConfigError

SWARM = """
[goal]
objective = "Reconcile instance ${seed}."
budget_usd = "1"
call_cap = 99
[[tasks.lenses]]
title = "shard 1 of ${seed}"
prompt = "instance ${seed}, shard 1"
[[tasks.lenses]]
title = "shard 2 of ${seed}"
prompt = "instance ${seed}, shard 2"
[workers]
model = "sim"
count = 2
concurrency = 2
max_steps = 3
[policy]
kind = "independent"
[lead]
model = "sim"
max_steps = 2
prompt = "merge them"
[providers.sim]
kind = "simulated"
models = ["sim"]
"""

CELLS = """seeds = [1, 2]
budget_usd = "0.25"
call_cap = 12
[[cells]]
name = "pair/lead-2"
[[cells]]
name = "single/lead-1"
workers = { count = 1, max_steps = 5 }
lead = { max_steps = 1, prompt = "merge them yourself" }
[[cells]]
name = "team3"
workers = { count = 3 }
policy = { kind = "team" }
[[claims]]
sentence = "two workers beat one"
a = "pair/lead-2"
b = "single/lead-1"
"""


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-cc-"))  # short: a trial's plane socket lives under the campaign's dir
    yield path
    shutil.rmtree(path, ignore_errors=True)


def load_text(tmp_path: Path, campaign: str, swarm: str = SWARM) -> Campaign:
    (tmp_path / "s.toml").write_text(swarm)
    (tmp_path / "c.toml").write_text('[campaign]\nname = "c"\nswarm = "s.toml"\n' + campaign)
    return load_campaign(tmp_path / "c.toml", cwd=tmp_path)


def test_each_cell_is_the_swarm_file_with_its_own_keys_under_the_one_cap(tmp_path: Path) -> None:
    c = load_text(tmp_path, CELLS)
    assert [cell.name for cell in c.cells] == ["pair/lead-2", "single/lead-1", "team3"]
    assert [t.key for t in c.trials] == ["pair/lead-2#1", "pair/lead-2#2", "single/lead-1#1", "single/lead-1#2",
                                         "team3#1", "team3#2"]
    trials = {t.key: t.config for t in c.trials}
    for key, config in trials.items():
        goal = config.goal
        assert (goal.budget_micro_usd, goal.call_cap) == (250_000, 12)  # every cell under the same cap
        seed = key.rsplit("#", 1)[1]
        # the problem is the seed's, the same in every cell: both shards, shared as they are
        assert [lens.prompt for lens in config.tasks.lenses] == [f"instance {seed}, shard 1",
                                                                 f"instance {seed}, shard 2"]
    pair, single, team = trials["pair/lead-2#1"], trials["single/lead-1#2"], trials["team3#1"]
    assert (pair.workers.count, pair.workers.max_steps, pair.lead.max_steps, pair.lead.prompt) == (2, 3, 2,
                                                                                                   "merge them")
    assert (single.workers.count, single.workers.concurrency, single.workers.max_steps) == (1, 1, 5)
    assert (single.lead.max_steps, single.lead.prompt) == (1, "merge them yourself")
    assert single.policy.kind is PolicyKind.INDEPENDENT and team.policy.kind is PolicyKind.TEAM
    # concurrency follows the count, at most the swarm file's; a team on the seeded model is answered in turn,
    # all of its workers at once
    assert (pair.workers.concurrency, team.workers.count, team.workers.concurrency) == (2, 3, 3)
    assert c.claims == (("two workers beat one", "pair/lead-2", "single/lead-1"),)


@pytest.mark.parametrize(("cells", "field", "said"), [
    ('[[cells]]\nname = "a"\nworkers = { count = 0 }\n', "cells.a", "count must be a positive integer"),
    ('[[cells]]\nname = "a"\nworkers = { count = 2, wings = 1 }\n', "cells.a.workers.wings", "not a known setting"),
    ('[[cells]]\nname = "a"\nworkers = { concurrency = 2 }\n', "cells.0.workers", "follows its count"),
    ('[[cells]]\nname = "a"\ngoal = { call_cap = 2 }\n', "cells.0.goal", "not a known setting"),
    ('[[cells]]\nname = "a"\n[[cells]]\nname = "a"\n', "cells", "each cell's name once"),
    ('[[cells]]\nname = "a"\n[[claims]]\nsentence = "x"\na = "a"\nb = "b"\n', "claims.0.b", "not a cell"),
    ('[[cells]]\nname = "a"\npolicy = { kind = "mob" }\n', "cells.a", "mob"),
])
def test_a_bad_cell_or_claim_is_refused_naming_its_field(tmp_path: Path, cells: str, field: str,
                                                         said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_text(tmp_path, "seeds = [1]\n" + cells)
    assert caught.value.field == field and said in caught.value.message


def _rec(cell: str, seed: int, score: int) -> TrialRecord:
    return TrialRecord(f"{cell}#{seed}", cell, seed, f"run_{seed}", score, 5, 10, 100, 20, 2.0, 0.5, 2, True)


def test_the_files_claims_are_tested_seed_by_seed(tmp_path: Path) -> None:
    c = load_text(tmp_path, CELLS)
    records = [_rec("pair/lead-2", 1, 900), _rec("pair/lead-2", 2, 800), _rec("single/lead-1", 1, 400),
               _rec("single/lead-1", 2, 850), _rec("team3", 1, 0), _rec("team3", 2, 0)]
    summary = summarise(c, records)
    (claim,) = summary.claims
    assert claim.sentence == "two workers beat one"
    assert (claim.comparison.a, claim.comparison.b) == ("pair/lead-2", "single/lead-1")
    assert claim.comparison.test.diffs == (500.0, -50.0)
    assert claim.verdict == "untested"  # two seeds: fewer than a trustworthy interval needs
    assert summary.to_dict()["claims"][0]["text"].startswith('"two workers beat one" is not tested')
    assert [cell["family"] for cell in summary.to_dict()["cells"]] == ["cells", "cells", "cells"]


def test_on_a_model_that_is_not_seeded_the_report_says_how_much_each_figure_moved(tmp_path: Path) -> None:
    from swarmyard.campaign.files import markdown, write_files

    local = SWARM.replace('model = "sim"', 'model = "qwen2.5-coder-0.5b-instruct"').split("[providers.sim]")[0]
    c = load_text(tmp_path, CELLS, local + '[providers.local]\nkind = "local"\nmodels = '
                  '["qwen2.5-coder-0.5b-instruct"]\n')
    assert not c.reproducible
    records = [TrialRecord("pair/lead-2#1", "pair/lead-2", 1, "run_1", 900, 0, 8, 3000, 200, 60.0, None, 1, True),
               TrialRecord("pair/lead-2#2", "pair/lead-2", 2, "run_2", 500, 0, 10, 4000, 300, 90.0, None, 1, True),
               TrialRecord("team3#1", "team3", 1, "", None, 0, 0, 0, 0, 5.0, None, 0, False, "provider_error: x")]
    summary = summarise(c, records)
    cells = {cell["name"]: cell for cell in summary.to_dict()["cells"]}
    pair = cells["pair/lead-2"]["ranges"]
    assert (pair["score"]["min"], pair["score"]["max"]) == (500, 900)
    assert (pair["calls"]["min"], pair["calls"]["max"], pair["tokens"]["max"]) == (8, 10, 4300)
    assert pair["wall_s"]["sd"] == pytest.approx(21.213, abs=0.001)
    # a failed trial counts 0 in the score, and measured its time only
    assert cells["team3"]["ranges"] == {"score": {"sd": 0.0, "min": 0, "max": 0},
                                        "wall_s": {"sd": 0.0, "min": 5.0, "max": 5.0}}
    page = markdown(summary, [])
    assert "## What can vary, and by how much" in page
    assert ("- pair/lead-2 over 2 trials: score sd 282.8 [500, 900]; calls sd 1.4 [8, 10]; tokens sd 777.8 "
            "[3,200, 4,300]; spend (micro-USD) sd 0.0 [0, 0]; wall s sd 21.2 [60.0, 90.0]") in page
    assert "The trials took 155.0 s in all." in page
    pytest.importorskip("matplotlib")
    files = write_files(summary)
    # on this model the wall time is a figure of its own: a plot of score against it, linked from the page
    assert [p.name for p in files.plots] == ["score-vs-tokens.png", "score-vs-wall.png"]
    assert all(p.stat().st_size > 0 for p in files.plots)
    assert "![score-vs-wall.png](score-vs-wall.png)" in files.markdown.read_text()


def test_a_sweep_draws_score_against_n_beside_score_against_tokens(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from swarmyard.campaign.files import write_files

    c = load_text(tmp_path, 'seeds = [1, 2]\n[sweep]\nn = [1, 2]\nhistory = "scored_history"\ntop_k = 3\n')
    names = [cell.name for cell in c.cells]
    assert sorted(names) == ["best@1", "best@2", "team@1", "team@2"]
    records = [_rec(name, seed, 100 * (index + 1) + seed) for index, name in enumerate(names) for seed in (1, 2)]
    files = write_files(summarise(c, records))
    # the simulated model is seeded: no wall-time plot, and the sweep's own plot over n
    assert [p.name for p in files.plots] == ["score-vs-tokens.png", "score-vs-n.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in files.plots)
