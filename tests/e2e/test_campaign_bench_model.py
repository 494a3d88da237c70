"""``swarmyard bench campaign --json`` on the embedded Qwen 0.5B model: the twin of the real-model campaign.

``examples/campaigns/reconciliation-local-twin.toml`` (2 cells x 2 seeds: three governed workers on three shards of
the reconciliation, the lead merging with its sqlquery tool or writing the merged list itself) runs through the
console script in real bubblewrap machines. Every trial must be scored by the evaluator (its holdout score, read
back from the trial's own store, is the score the campaign recorded), and the JSON's table must be the one its
trial records make: each cell's mean, spread and seeds, each pair's per-seed differences, the wall times summed.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import pytest

from rigs.model_runs import run_while_progressing
from swarmyard.store import open_store

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.bwrap]

TWIN = Path(__file__).resolve().parents[2] / "examples" / "campaigns" / "reconciliation-local-twin.toml"
CELLS = ["team3/merge-tool", "team3/lead-writes"]
SEEDS = [1, 2]


def test_the_twin_campaign_scores_every_trial_and_its_table_is_its_records(short_tmp: Path) -> None:
    # the model file is assembled once into the user's cache: the run keeps HOME, and nothing else of ours
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", str(short_tmp)),
           "LANG": "C.UTF-8"}
    if os.environ.get("XDG_CACHE_HOME"):
        env["XDG_CACHE_HOME"] = os.environ["XDG_CACHE_HOME"]
    done = run_while_progressing([sys.executable, "-m", "swarmyard.cli", "bench", "campaign", str(TWIN), "--json"],
                                 cwd=short_tmp, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    print(json.dumps({k: doc[k] for k in ("wall_s", "trials_wall_s", "host")}))  # shown with pytest -rP
    assert (doc["area"], doc["campaign"], doc["complete"]) == ("campaign", "reconciliation-local-twin", True)
    assert (doc["trials_total"], doc["trials_done"]) == (4, 4)
    assert [c["name"] for c in doc["cells"]] == CELLS
    folder = Path(doc["dir"])
    assert folder == short_tmp / "campaigns" / "reconciliation-local-twin"
    records = [json.loads(line) for line in (folder / "trials.jsonl").read_text().splitlines()]
    # the bench runs seed by seed: every cell of seed 1, then seed 2
    assert [(r["cell"], r["seed"]) for r in records] == [(c, s) for s in SEEDS for c in CELLS]
    by_key = {(r["cell"], r["seed"]): r for r in records}
    for cell in doc["cells"]:
        assert cell["seeds"] == SEEDS and cell["family"] == "cells"
        counted = []
        for trial in cell["trials"]:
            record = by_key[(cell["name"], trial["seed"])]
            assert trial["run_id"] == record["run_id"] and trial["score"] == record["score"]
            assert trial["wall_s"] == record["wall_s"] > 0
            if record["error"]:
                assert trial["counted_score"] == 0  # a failed trial counts as the floor, never dropped
            else:
                # scored by the evaluator: the trial's own store holds the holdout score the campaign recorded
                store = open_store(f"sqlite:///{folder / 'runs' / record['run_id'] / 'store.db'}")
                try:
                    (goal,) = store.list_goals()
                    holdout = [s.score for s in store.list_scores(goal.id, split="holdout")]
                finally:
                    store.close()
                assert holdout and holdout[-1] == record["score"], (cell["name"], trial["seed"], holdout)
                assert 0 <= record["score"] <= 1_000_000 and record["calls"] > 0
                assert trial["counted_score"] == record["score"]
            counted.append(trial["counted_score"])
        assert cell["mean"] == pytest.approx(statistics.mean(counted))
        assert (cell["min"], cell["max"]) == (min(counted), max(counted))
        assert cell["sd"] == pytest.approx(statistics.stdev(counted))
        assert cell["failed"] == sum(1 for t in cell["trials"] if t["error"])
    (pair,) = doc["comparisons"]
    (a, b) = doc["cells"]
    assert (pair["a"], pair["b"], pair["seeds"]) == (*CELLS, SEEDS)
    assert pair["differences"] == [x["counted_score"] - y["counted_score"]
                                   for x, y in zip(a["trials"], b["trials"], strict=True)]
    (claim,) = doc["claims"]
    assert claim["verdict"] == "untested"  # two seeds: the report says so rather than draw a conclusion
    assert doc["trials_wall_s"] == pytest.approx(sum(r["wall_s"] for r in records), abs=0.1)
    assert doc["wall_s"] >= doc["trials_wall_s"] - 0.1
    assert doc["host"]["cpus"] >= 1 and len(doc["host"]["load_before"]) == 3
    page = (folder / "campaign.md").read_text()
    assert all(f"| {name} |" in page for name in CELLS) and "What can vary" in page
