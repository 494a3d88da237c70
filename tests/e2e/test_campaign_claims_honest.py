"""What a campaign's report says of itself must follow from the campaign, through the ``swarmyard`` console
script. Each campaign here has every trial in its record already (as a killed campaign leaves them) and is
resumed, so nothing runs and the report is computed from the record.

- A campaign with an ``explore`` or ``groups`` cell of its own (``[[cells]]``) on the simulated provider was
  reported ``"reproducible": true``, "the same scores, calls and tokens every time", though turns do not cover
  direction claims or later rounds (the campaign's own code says so, and had a sentence for it that was never
  reached): only the grid's policy was looked at.
- Under ``match = "tokens"`` the table said "N of 3,000" where N counted the lead's tokens too, though the
  3,000 is the workers' allowance and the lead's share is outside the match (so a cell could show more than its
  allowance, or hide how little its workers used): the workers' own tokens are now recorded and shown.
- A token sweep's crossing said "team@n loses to best@n below about 1500 tokens per agent" from the sign of a
  mean difference its own claim found not significant (one seed of eight lost, seven tied, p = 1): a side is now
  a loss or a win only where its differences are significant.
- ``swarmyard bench campaign`` did not say where its folder is until the end (``swarmyard campaign`` says it
  before the first trial).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SWARM = (REPO / "examples" / "campaigns" / "hidden-code-simulated.toml").read_text().replace(
    'bundle = "../bundles/hidden-code"', f'bundle = "{(REPO / "examples/bundles/hidden-code").as_posix()}"')


def _line(cell: str, seed: int, score: int | None, error: str = "") -> str:
    return json.dumps({"key": f"{cell}#{seed}", "cell": cell, "seed": seed, "run_id": f"run_{cell[:4]}{seed}",
                       "score": score, "spend_micro_usd": 0 if error else 900, "calls": 0 if error else 20,
                       "tokens_in": 0 if error else 3000, "tokens_out": 0 if error else 200, "wall_s": 9.5,
                       "similarity": None if error else 0.9, "submissions": 0 if error else 19,
                       "synthesis": not error, "error": error})


def _resumed(folder: Path, text: str, lines: list[str],
             command: tuple[str, ...] = ("campaign",)) -> subprocess.CompletedProcess[str]:
    """``swarmyard campaign c.toml --resume --json`` (or another ``command``) on a folder whose record holds
    ``lines``."""
    (folder / "s.toml").write_text(SWARM)
    (folder / "c.toml").write_text(text)
    where = folder / "campaigns" / "c"
    where.mkdir(parents=True)
    digest = hashlib.sha256(text.encode() + b"\0" + SWARM.encode()).hexdigest()
    (where / "campaign.json").write_text(json.dumps({"name": "c", "digest": digest}))
    (where / "trials.jsonl").write_text("".join(line + "\n" for line in lines))
    script = shutil.which("swarmyard")
    assert script is not None, "the swarmyard console script is installed"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    return subprocess.run([script, *command, "c.toml", "--resume", "--json"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("policy", "reproducible"), [
    ('{ kind = "explore", directions = ["a", "b", "c"] }', False),
    ('{ kind = "groups", groups = 2 }', False),
    ('{ kind = "team" }', True),
])
def test_an_explore_or_groups_cell_is_not_called_reproducible(short_tmp: Path, policy: str,
                                                              reproducible: bool) -> None:
    text = ('[campaign]\nname = "c"\nswarm = "s.toml"\nseeds = [1, 2]\n'
            f'[[cells]]\nname = "own"\nworkers = {{ count = 2 }}\npolicy = {policy}\n'
            '[[cells]]\nname = "one"\nworkers = { count = 1 }\n')
    lines = [_line(cell, seed, 100_000 * seed) for cell in ("own", "one") for seed in (1, 2)]
    done = _resumed(short_tmp, text, lines)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["reproducible"] is reproducible
    report = (short_tmp / "campaigns" / "c" / "campaign.md").read_text()
    assert ("same scores, calls and tokens every time" in report) is reproducible
    assert ("may differ when run again" in report) is not reproducible


@pytest.mark.parametrize("command", [("campaign",), ("bench", "campaign")])
def test_the_folder_is_announced_before_the_first_trial(short_tmp: Path, command: tuple[str, ...]) -> None:
    text = '[campaign]\nname = "c"\nswarm = "s.toml"\nseeds = [1]\n[sweep]\nn = [1]\n'
    done = _resumed(short_tmp, text, [_line("best@1", 1, 5), _line("team@1", 1, 7)], command)
    assert done.returncode == 0, done.stderr[-3000:]
    first = done.stderr.splitlines()[0]
    assert first.startswith("campaign c: 2 cells x 1 seeds = 2 trials;"), done.stderr[-3000:]
    assert first.endswith(f"its record, report and runs go to {short_tmp / 'campaigns' / 'c'}"), first


@pytest.mark.slow
def test_under_a_token_match_the_table_shows_the_workers_own_tokens_of_their_allowance(short_tmp: Path) -> None:
    (short_tmp / "s.toml").write_text(SWARM)
    (short_tmp / "c.toml").write_text('[campaign]\nname = "c"\nswarm = "s.toml"\nseeds = [1]\nmatch = "tokens"\n'
                                      "tokens = 3000\n[grid]\ncohort = 2\n")
    script = shutil.which("swarmyard")
    assert script is not None
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8"}
    done = subprocess.run([script, "campaign", "c.toml", "--json"], cwd=short_tmp, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    report = (short_tmp / "campaigns" / "c" / "campaign.md").read_text()
    for cell in result["cells"]:
        (trial,) = cell["trials"]
        store = short_tmp / "campaigns" / "c" / "runs" / trial["run_id"] / "store.db"
        with sqlite3.connect(store) as db:
            (workers,), = db.execute("SELECT SUM(settled) FROM tasks WHERE group_name != 'lead'").fetchall()
            (lead,), = db.execute("SELECT SUM(settled) FROM tasks WHERE group_name = 'lead'").fetchall()
        # one micro-USD a token: what each side settled is its tokens
        assert trial["worker_tokens"] == workers <= 3000 == cell["allowance"]
        assert trial["tokens_in"] + trial["tokens_out"] == workers + lead and lead > 0  # the lead spent too
        assert cell["worker_tokens"] == workers
        row = next(line for line in report.splitlines() if line.startswith(f"| {cell['name']} |"))
        assert f"; workers {workers:,} of 3,000 |" in row, row


def test_a_crossing_says_loses_only_where_the_difference_is_significant(short_tmp: Path) -> None:
    text = ('[campaign]\nname = "c"\nswarm = "s.toml"\nmatch = "tokens"\n'
            "[sweep]\nn = [4]\ntokens_per_agent = [750, 1500]\n")  # seeds: 1..8 by default
    lines = []
    for seed in range(1, 9):
        lines += [_line("best@4/t750", seed, 100_000), _line("team@4/t750", seed, 99_000 if seed == 1 else 100_000),
                  _line("best@4/t1500", seed, 100_000), _line("team@4/t1500", seed, 101_000 + seed)]
    done = _resumed(short_tmp, text, lines)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    verdicts = {c["tokens_per_agent"]: c["verdict"] for c in result["claims"]}
    assert verdicts == {750: "not shown", 1500: "holds"}
    (crossing,) = result["crossings"]
    assert "loses to" not in crossing["text"], crossing["text"]
    assert crossing["text"].startswith("n = 4: team@n trails, on the mean only (not significant at 750), best@n "
                                       "below about 1500 tokens per agent and beats it from there on")
    assert crossing["text"] in (short_tmp / "campaigns" / "c" / "campaign.md").read_text()
