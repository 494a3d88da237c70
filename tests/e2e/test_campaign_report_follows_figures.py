"""What a campaign says must follow from its own figures and its own file, through the ``swarmyard`` console script.

- A claim whose Wilcoxon p (and sign test p) were below 5% but whose interval of the mean difference reached 0
  (ten seeds won by a little, one lost by a lot) read "is not shown (the difference is not significant at 5%)"
  beside "Wilcoxon signed-rank p = 0.0459, sign test p = 0.0117": the sentence contradicted its own figures.
- A campaign on the simulated provider whose trials ran into their deadline was still reported ``"reproducible":
  true``, "the same scores, calls and tokens every time": the deadline is wall time, and the same file with
  ``deadline_s = 4`` scored 187,500, 375,000 and 0 on an idle host and failed every trial (timeout) under load.
- ``match = "calls"`` with a call cap whose shares make a goal's cap larger than a 64-bit integer passed the
  file's checks, made the campaign's folder and stopped at the first trial with an internal OverflowError.

The first two resume a record that holds every trial (nothing runs); the third is a bad file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SWARM = (REPO / "examples" / "campaigns" / "hidden-code-simulated.toml").read_text().replace(
    'bundle = "../bundles/hidden-code"', f'bundle = "{(REPO / "examples/bundles/hidden-code").as_posix()}"')


def _env(folder: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}


def _line(cell: str, seed: int, score: int, wall_s: float = 9.5) -> str:
    return json.dumps({"key": f"{cell}#{seed}", "cell": cell, "seed": seed, "run_id": f"run_{cell}{seed}",
                       "score": score, "spend_micro_usd": 900, "calls": 20, "tokens_in": 3000, "tokens_out": 200,
                       "wall_s": wall_s, "similarity": 0.9, "submissions": 19, "synthesis": True, "error": ""})


def _resumed(folder: Path, text: str, lines: list[str]) -> subprocess.CompletedProcess[str]:
    """``swarmyard campaign c.toml --resume --json`` on a folder whose record holds ``lines``."""
    (folder / "s.toml").write_text(SWARM)
    (folder / "c.toml").write_text(text)
    where = folder / "campaigns" / "c"
    where.mkdir(parents=True)
    digest = hashlib.sha256(text.encode() + b"\0" + SWARM.encode()).hexdigest()
    (where / "campaign.json").write_text(json.dumps({"name": "c", "digest": digest}))
    (where / "trials.jsonl").write_text("".join(line + "\n" for line in lines))
    script = shutil.which("swarmyard")
    assert script is not None, "the swarmyard console script is installed"
    return subprocess.run([script, "campaign", "c.toml", "--resume", "--json"], cwd=folder, env=_env(folder),
                          capture_output=True, text=True, timeout=300)


def test_a_claim_not_shown_for_its_interval_does_not_call_significant_tests_insignificant(short_tmp: Path) -> None:
    seeds = list(range(1, 12))
    differences = [-400_000, 10_000, 20_000, 20_000, 20_000, 30_000, 30_000, 30_000, 30_000, 30_000, 30_000]
    text = ('[campaign]\nname = "c"\nswarm = "s.toml"\nseeds = [' + ", ".join(map(str, seeds)) + "]\n"
            '[[cells]]\nname = "a"\n[[cells]]\nname = "b"\nworkers = { history_top_k = 2 }\n'
            '[[claims]]\nsentence = "a beats b"\na = "a"\nb = "b"\n')
    lines = ([_line("a", s, 500_000 + d) for s, d in zip(seeds, differences, strict=True)]
             + [_line("b", s, 500_000) for s in seeds])
    done = _resumed(short_tmp, text, lines)
    assert done.returncode == 0, done.stderr[-3000:]
    (claim,) = json.loads(done.stdout)["claims"]
    # the figures: both tests below 5%, the interval of the mean difference across 0
    assert (claim["a_wins"], claim["b_wins"], claim["ties"]) == (10, 1, 0)
    assert claim["wilcoxon_p"] < 0.05 and claim["sign_test_p"] < 0.05
    assert claim["ci_low"] < 0 < claim["ci_high"] and claim["mean_difference"] < 0
    assert claim["verdict"] == "not shown"
    # so the sentence may not say the difference is not significant: it says why it is not shown
    assert "not significant" not in claim["text"], claim["text"]
    assert "Wilcoxon's p is below 5%, but the 95% interval of the mean difference" in claim["text"]
    report = (short_tmp / "campaigns" / "c" / "campaign.md").read_text()
    assert claim["text"] in report and "not significant at 5%" not in report


def test_a_simulated_campaign_whose_trials_ran_into_their_deadline_is_not_called_reproducible(
        short_tmp: Path) -> None:
    text = '[campaign]\nname = "c"\nswarm = "s.toml"\nseeds = [1, 2]\ndeadline_s = 4\n[[cells]]\nname = "solo"\n'
    # seed 1 ran 5.5 s under a 4 s deadline (it may have been cut anywhere); seed 2 ended well before it
    done = _resumed(short_tmp, text, [_line("solo", 1, 187_500, wall_s=5.5), _line("solo", 2, 375_000, wall_s=2.0)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["reproducible"] is False
    report = (short_tmp / "campaigns" / "c" / "campaign.md").read_text()
    assert "same scores, calls and tokens every time; only wall time" not in report
    assert "ran as long as their deadline" in report and "solo seed 1 (5.5 s)" in report
    assert "solo seed 2" not in report.split("ran as long as their deadline")[1].split("\n")[0]


def test_the_same_record_well_within_its_deadline_is_still_reproducible(short_tmp: Path) -> None:
    text = '[campaign]\nname = "c"\nswarm = "s.toml"\nseeds = [1, 2]\ndeadline_s = 4\n[[cells]]\nname = "solo"\n'
    done = _resumed(short_tmp, text, [_line("solo", 1, 187_500, wall_s=3.0), _line("solo", 2, 375_000, wall_s=2.0)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["reproducible"] is True
    report = (short_tmp / "campaigns" / "c" / "campaign.md").read_text()
    assert "same scores, calls and tokens every time; only wall time" in report


def test_a_call_match_whose_goal_cap_overflows_is_refused_before_any_folder(short_tmp: Path) -> None:
    (short_tmp / "s.toml").write_text(SWARM)
    (short_tmp / "c.toml").write_text('[campaign]\nname = "c"\nswarm = "s.toml"\nseeds = [1]\nmatch = "calls"\n'
                                      "call_cap = 9223372036854775806\n[grid]\ncohort = 2\n")
    script = shutil.which("swarmyard")
    assert script is not None
    done = subprocess.run([script, "campaign", "c.toml", "--json"], cwd=short_tmp, env=_env(short_tmp),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error (config_error): campaign.call_cap: "), done.stderr
    assert "more than the 9,223,372,036,854,775,807 a goal can hold" in lines[0]
    assert not (short_tmp / "campaigns").exists() and done.stdout == ""


def _refused_dir(folder: Path, directory: str) -> str:
    (folder / "s.toml").write_text(SWARM)
    (folder / "c.toml").write_text(f'[campaign]\nname = "c"\nswarm = "s.toml"\nseeds = [1]\ndir = "{directory}"\n'
                                   '[[cells]]\nname = "solo"\n')
    before = sorted(p.name for p in folder.iterdir())
    script = shutil.which("swarmyard")
    assert script is not None
    done = subprocess.run([script, "campaign", "c.toml", "--json"], cwd=folder, env=_env(folder),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error (config_error): campaign.dir: "), done.stderr
    assert sorted(p.name for p in folder.iterdir()) == before and done.stdout == ""  # nothing written
    return lines[0]


def test_a_dir_that_holds_other_files_is_refused_before_anything_is_written_there(short_tmp: Path) -> None:
    # dir = "." (or "/", or a home folder) put .lock, campaign.json, trials.jsonl, runs/ and the report among the
    # folder's own files, and ran every trial
    line = _refused_dir(short_tmp, ".")
    assert "already holds files that are not a campaign's (c.toml, s.toml)" in line


def test_a_dir_that_is_a_file_is_a_config_error(short_tmp: Path) -> None:
    # was an internal FileExistsError
    assert "s.toml exists and is not a folder" in _refused_dir(short_tmp, "s.toml")


def test_a_dir_no_folder_can_be_made_in_is_a_config_error(short_tmp: Path) -> None:
    # was an internal FileNotFoundError from the campaign's lock (procfs makes no folders)
    line = _refused_dir(short_tmp, "/proc/swarmyard-campaign")
    assert "cannot make the campaign's folder /proc/swarmyard-campaign: No such file or directory" in line


def test_a_swarm_file_that_is_a_fifo_is_refused_not_waited_on(short_tmp: Path) -> None:
    # open() of a FIFO nobody writes waits for ever: the campaign hung before its first line
    os.mkfifo(short_tmp / "s.toml")
    (short_tmp / "c.toml").write_text('[campaign]\nname = "c"\nswarm = "s.toml"\nseeds = [1]\n[[cells]]\nname = "a"\n')
    script = shutil.which("swarmyard")
    assert script is not None
    done = subprocess.run([script, "campaign", "c.toml", "--json"], cwd=short_tmp, env=_env(short_tmp),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == ["error (config_error): campaign.swarm: s.toml is not a regular file"], lines
    assert not (short_tmp / "campaigns").exists()


def test_a_claim_on_small_scores_prints_the_figures_it_holds_on(short_tmp: Path) -> None:
    # scores of a few points (a bundle of five cases scores 0 to 5): six seeds won by one point, fourteen tied.
    # The claim holds (both tests p = 0.0312, interval above 0) but read "a - b = +0 on the mean ... 95% interval
    # of the difference [+0, +0]", and the cell's row "0 [0, 0]": every figure rounded to a whole point
    seeds = list(range(1, 21))
    text = ('[campaign]\nname = "c"\nswarm = "s.toml"\nseeds = [' + ", ".join(map(str, seeds)) + "]\n"
            '[[cells]]\nname = "a"\n[[cells]]\nname = "b"\nworkers = { history_top_k = 2 }\n'
            '[[claims]]\nsentence = "a beats b"\na = "a"\nb = "b"\n')
    lines = [_line("a", s, 1 if s <= 6 else 0) for s in seeds] + [_line("b", s, 0) for s in seeds]
    done = _resumed(short_tmp, text, lines)
    assert done.returncode == 0, done.stderr[-3000:]
    (claim,) = json.loads(done.stdout)["claims"]
    assert claim["verdict"] == "holds" and claim["mean_difference"] == 0.3 and claim["ci_low"] > 0
    assert "a - b = +0.3 on the mean over 20 seeds" in claim["text"], claim["text"]
    assert "[+0, +0]" not in claim["text"] and f"[+{claim['ci_low']:.3g}, +{claim['ci_high']:.3g}]" in claim["text"]
    report = (short_tmp / "campaigns" / "c" / "campaign.md").read_text()
    row = next(line for line in report.splitlines() if line.startswith("| a | 1 | 20 |"))
    assert "| 0.3 [" in row, row
    pair = next(line for line in report.splitlines() if line.startswith("| a | b | 20 |"))
    assert "| +0.3 |" in pair, pair
