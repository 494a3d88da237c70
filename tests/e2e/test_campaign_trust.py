"""Campaigns a researcher can trust, through ``swarmyard campaign FILE --json`` (the console script):

- the same file and seeds give the same trials, byte for byte but for ids and times, in two folders;
- cells are compared seed by seed (mean difference, interval, wins, exact tests) and the conclusion follows them;
- a failed trial counts as 0 in its cell and is listed with its reason;
- ``match = "tokens"`` gives the workers of every cell of a seed the same tokens, as the trial stores hold them;
- progress goes to stderr (the output folder first), and stdout stays one JSON document.

Trials are real runs (real sandboxes, the plane, the broker, the evaluator scoring the hidden-code bundle) on the
simulated provider's seeded ``attempts`` model.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SWARM = (REPO / "examples" / "campaigns" / "hidden-code-simulated.toml").as_posix()


def _console_script() -> str:
    beside = Path(sys.executable).with_name("swarmyard")
    found = str(beside) if beside.exists() else shutil.which("swarmyard")
    assert found, "the swarmyard console script is not installed"
    return found


def _campaign(cwd: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd), "LANG": "C.UTF-8"}
    for name in ("XDG_CACHE_HOME", "SWARMYARD_STATE_DIR", "PYENV_VERSION", "PYENV_ROOT"):
        if name in os.environ:
            env[name] = os.environ[name]
    return subprocess.run([_console_script(), "campaign", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _trials(folder: Path) -> list[str]:
    """The record's lines with the run's id and wall time taken out, canonical JSON."""
    out = []
    for line in (folder / "trials.jsonl").read_text().splitlines():
        record = json.loads(line)
        del record["run_id"], record["wall_s"]
        out.append(json.dumps(record, sort_keys=True, separators=(",", ":")))
    return out


def _table(result: dict[str, Any]) -> dict[str, Any]:
    """The results without what may differ between two runs of one campaign: ids, times and the folder."""
    cells = []
    for cell in result["cells"]:
        cell = {k: v for k, v in cell.items() if k != "wall_s"}
        cell["intervals"] = {k: v for k, v in cell["intervals"].items() if k != "wall_s"}
        cell["ranges"] = {k: v for k, v in cell["ranges"].items() if k != "wall_s"}
        cell["trials"] = [{k: v for k, v in t.items() if k not in ("run_id", "wall_s", "report")}
                          for t in cell["trials"]]
        cells.append(cell)
    return {"cells": cells, "comparisons": result["comparisons"], "claims": result["claims"]}


@pytest.mark.slow
def test_the_same_2x2_twice_gives_the_same_trials_and_table(short_tmp: Path) -> None:
    text = f'[campaign]\nname = "r"\nswarm = "{SWARM}"\nseeds = [1, 2]\n[grid]\ncohort = 3\n'
    results, records = [], []
    for name in ("one", "two"):
        folder = short_tmp / name
        folder.mkdir()
        (folder / "c.toml").write_text(text)
        done = _campaign(folder, "c.toml", "--json")
        assert done.returncode == 0, done.stderr[-3000:]
        assert "may not be reproducible" not in done.stderr  # every turn was taken in order, none forced
        results.append(json.loads(done.stdout))
        records.append(_trials(folder / "campaigns" / "r"))
    assert len(records[0]) == 8
    assert records[0] == records[1]  # scores, calls, tokens, spend, similarity: byte for byte
    assert _table(results[0]) == _table(results[1])
    cohorts = [t for c in results[0]["cells"] if c["n"] == 3 for t in c["trials"]]
    assert all(t["calls"] > 3 and t["score"] is not None for t in cohorts)  # three workers really took turns
    assert results[0]["reproducible"] is True


def _record_line(cell: str, seed: int, score: int | None, error: str = "") -> str:
    return json.dumps({"key": f"{cell}#{seed}", "cell": cell, "seed": seed, "run_id": f"run_{cell[:4]}{seed}",
                       "score": score, "spend_micro_usd": 0 if error else 900, "calls": 0 if error else 20,
                       "tokens_in": 0 if error else 3000, "tokens_out": 0 if error else 200, "wall_s": 9.5,
                       "similarity": None if error else 0.9, "submissions": 0 if error else 19,
                       "synthesis": not error, "error": error})


#: team@1 - best@1 on seeds 1..8, in thousands: 7 wins, 1 loss
DIFFS = (1, -2, 3, 4, 5, 6, 7, 8)


def _recorded_campaign(folder: Path, team_failed_on: int | None = None) -> subprocess.CompletedProcess[str]:
    """A campaign whose 16 trials are all in its record (as a killed campaign leaves them), then resumed: nothing
    runs again, and the summary is computed from the record."""
    text = f'[campaign]\nname = "p"\nswarm = "{SWARM}"\n[sweep]\nn = [1]\n'  # seeds: 1..8 by default
    (folder / "c.toml").write_text(text)
    where = folder / "campaigns" / "p"
    where.mkdir(parents=True)
    digest = hashlib.sha256(text.encode() + b"\0" + Path(SWARM).read_text().encode()).hexdigest()
    (where / "campaign.json").write_text(json.dumps({"name": "p", "digest": digest}))
    lines = [_record_line("best@1", seed, 100_000) for seed in range(1, 9)]
    for seed, diff in zip(range(1, 9), DIFFS, strict=True):
        if seed == team_failed_on:
            lines.append(_record_line("team@1", seed, None, "provider_error: the model went away"))
        else:
            lines.append(_record_line("team@1", seed, 100_000 + 1000 * diff))
    (where / "trials.jsonl").write_text("".join(line + "\n" for line in lines))
    return _campaign(folder, "c.toml", "--resume", "--json", timeout=300)


def test_cells_are_compared_seed_by_seed_and_the_conclusion_follows_the_figures(short_tmp: Path) -> None:
    done = _recorded_campaign(short_tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["seeds"] == list(range(1, 9))
    (pair,) = result["comparisons"]
    assert (pair["a"], pair["b"]) == ("best@1", "team@1")
    assert pair["differences"] == [-1000.0 * d for d in DIFFS]
    assert pair["mean_difference"] == -4000  # -(1 - 2 + 3 + ... + 8) * 1000 / 8
    assert (pair["a_wins"], pair["b_wins"], pair["ties"]) == (1, 7, 0)
    assert pair["sign_test_p"] == 2 * 9 / 256 and pair["wilcoxon_p"] == 6 / 256  # exact, counted by hand
    assert pair["interval_trusted"] is True and pair["ci_low"] <= -4000 <= pair["ci_high"] < 0
    (claim,) = result["claims"]
    assert claim["sentence"] == "team@1 beats best@1" and claim["verdict"] == "holds"
    assert claim["mean_difference"] == 4000 and claim["wilcoxon_p"] == 6 / 256
    report = (short_tmp / "campaigns" / "p" / "campaign.md").read_text()
    assert '"team@1 beats best@1" holds (team@1 - best@1 = +4,000' in report
    assert "[seed 3](runs/run_team3/report.html)" in report  # every trial's own report is linked


def test_a_failed_trial_counts_as_zero_and_lowers_its_cells_mean(short_tmp: Path) -> None:
    done = _recorded_campaign(short_tmp, team_failed_on=8)
    assert done.returncode == 0, done.stderr[-3000:]
    cells = {c["name"]: c for c in json.loads(done.stdout)["cells"]}
    team = cells["team@1"]
    survivors = [100_000 + 1000 * d for d in DIFFS[:7]]
    assert team["failed"] == 1 and team["failure_rate"] == 1 / 8
    assert team["mean"] == sum(survivors) / 8  # the failure is a zero in the mean, not left out
    assert team["mean"] < sum(survivors) / 7
    assert team["trials"][-1]["counted_score"] == 0 and team["trials"][-1]["error"].startswith("provider_error")
    report = (short_tmp / "campaigns" / "p" / "campaign.md").read_text()
    assert "| team@1 | 1 | 8 | 1/8 (12%) |" in report
    assert "- team@1 seed 8: provider_error: the model went away" in report


@pytest.mark.slow
def test_match_tokens_gives_every_cell_of_a_seed_the_same_allowance(short_tmp: Path) -> None:
    (short_tmp / "c.toml").write_text(f'[campaign]\nname = "k"\nswarm = "{SWARM}"\nseeds = [1]\nmatch = "tokens"\n'
                                      "tokens = 3000\n[grid]\ncohort = 2\n")
    done = _campaign(short_tmp, "c.toml", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["match"] == "tokens"
    runs = short_tmp / "campaigns" / "k" / "runs"
    for cell in result["cells"]:
        (trial,) = cell["trials"]
        with sqlite3.connect(runs / trial["run_id"] / "store.db") as db:
            (ceiling, settled), = db.execute("SELECT budget, settled FROM goals").fetchall()
            # the allowance each task was given when it was made (an ended task's budget row is then cut to what
            # it used, the rest handed back): its task.created event
            made = {body["task"]: body["budget"] for (raw,) in db.execute(
                "SELECT body FROM events WHERE kind = 'task.created'") for body in [json.loads(raw)]}
            workers = [(made[task], used) for task, used in db.execute(
                "SELECT id, settled FROM tasks WHERE group_name != 'lead'")]
            (lead,), = [(made[task],) for (task,) in db.execute("SELECT id FROM tasks WHERE group_name = 'lead'")]
        n = cell["n"]
        # the workers' tokens in all are the same in every cell (one micro-USD a token), each worker its share,
        # and the lead one share more (and what the workers left), outside the match
        assert len(workers) == n and sum(budget for budget, _ in workers) == 3000 == cell["allowance"]
        assert {budget for budget, _ in workers} == {3000 // n} and ceiling == 3000 + 3000 // n
        # the lead: its share, and what the workers did not use, handed back when their tasks ended
        assert lead == ceiling - sum(used for _, used in workers) >= 3000 // n
        assert all(used <= budget for budget, used in workers)  # the allowance held
        assert settled == trial["tokens_in"] + trial["tokens_out"] > 0  # what it used, in tokens
        assert trial["calls"] > 3  # the allowance bound, not a call cap
    report = (short_tmp / "campaigns" / "k" / "campaign.md").read_text()
    assert "Matched on tokens" in report and " of 3,000 |" in report


def test_a_campaign_announces_its_folder_and_shows_progress_on_stderr(short_tmp: Path) -> None:
    (short_tmp / "c.toml").write_text(f'[campaign]\nname = "g"\nswarm = "{SWARM}"\nseeds = [1]\n[sweep]\nn = [1]\n')
    done = _campaign(short_tmp, "c.toml", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    json.loads(done.stdout)  # stdout is the results alone
    lines = done.stderr.splitlines()
    folder = short_tmp / "campaigns" / "g"
    assert lines[0] == (f"campaign g: 2 cells x 1 seeds = 2 trials; its record, report and runs go to {folder}")
    assert re.fullmatch(r"\[0/2\] \d+:\d\d elapsed, \$0\.000000 spent: running best@1 seed 1", lines[1]), lines[1]
    ended = [line for line in lines if " scored " in line]
    assert [line.split(": ", 1)[1].split(" scored ")[0] for line in ended] == ["best@1 seed 1", "team@1 seed 1"]
    assert ended[0].startswith("[1/2] ") and ended[1].startswith("[2/2] ")
    assert "running team@1 seed 1" in done.stderr
    assert "$0.000000 spent" not in ended[1]  # what was spent so far is counted as trials end
