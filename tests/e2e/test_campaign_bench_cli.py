"""``swarmyard bench campaign`` refuses what it cannot run before any trial starts, through the console script."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from rigs.cli import run_cli


def _bench(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("bench", "campaign", *args, cwd=cwd, timeout_s=900)


def test_with_no_file_named_and_none_here_it_says_what_to_do(tmp_path: Path) -> None:
    done = _bench(tmp_path, "--json")
    assert done.returncode == 1 and done.stdout == ""
    assert "reconciliation-local-4x5.toml" in done.stderr and "name a campaign file" in done.stderr
    assert not (tmp_path / "campaigns").exists()


def test_a_bad_cell_is_refused_naming_its_field_before_anything_runs(short_tmp: Path) -> None:
    shipped = Path(__file__).resolve().parents[2] / "examples" / "campaigns"
    swarm = shipped / "hidden-code-simulated.toml"
    (short_tmp / "c.toml").write_text(f'[campaign]\nname = "c"\nswarm = "{swarm}"\nseeds = [1]\n'
                                     '[[cells]]\nname = "one"\nworkers = { count = 0 }\n')
    done = _bench(short_tmp, str(short_tmp / "c.toml"), "--json", "--trials", "1")
    assert done.returncode == 1 and done.stdout == ""
    assert "cells.one" in done.stderr and "count must be a positive integer" in done.stderr
    assert not (short_tmp / "campaigns").exists()
    done = _bench(short_tmp, str(short_tmp / "c.toml"), "--trials", "0")
    assert done.returncode == 2  # a usage error: at least one trial


@pytest.mark.slow
def test_a_campaign_run_in_pieces_goes_seed_by_seed_and_keeps_what_each_piece_ran(short_tmp: Path) -> None:
    swarm = Path(__file__).resolve().parents[2] / "examples" / "campaigns" / "hidden-code-simulated.toml"
    (short_tmp / "c.toml").write_text(f'[campaign]\nname = "p"\nswarm = "{swarm}"\nseeds = [1, 2]\ncall_cap = 8\n'
                                      '[[cells]]\nname = "one"\n[[cells]]\nname = "two"\nworkers = { count = 2 }\n')
    first = _bench(short_tmp, str(short_tmp / "c.toml"), "--json", "--trials", "3")
    assert first.returncode == 0, first.stderr[-3000:]
    doc = json.loads(first.stdout)
    assert (doc["trials_done"], doc["trials_total"], doc["complete"]) == (3, 4, False)
    folder = short_tmp / "campaigns" / "p"
    ran = [json.loads(line) for line in (folder / "trials.jsonl").read_text().splitlines()]
    # every cell of seed 1, then seed 2: a piece that stops leaves whole seeds to pair
    assert [(r["cell"], r["seed"]) for r in ran] == [("one", 1), ("two", 1), ("one", 2)]
    assert doc["trials_wall_s"] == round(sum(r["wall_s"] for r in ran), 1)
    assert [c["seeds"] for c in doc["cells"]] == [[1, 2], [1]]
    second = _bench(short_tmp, str(short_tmp / "c.toml"), "--json", "--trials", "3", "--resume")
    assert second.returncode == 0, second.stderr[-3000:]
    doc = json.loads(second.stdout)
    assert (doc["trials_done"], doc["complete"]) == (4, True)
    after = [json.loads(line) for line in (folder / "trials.jsonl").read_text().splitlines()]
    assert after[:3] == ran and (after[3]["cell"], after[3]["seed"]) == ("two", 2)  # the first piece's kept
    assert all(t["score"] is not None for c in doc["cells"] for t in c["trials"])  # each scored by the evaluator
    assert doc["comparisons"][0]["seeds"] == [1, 2]
