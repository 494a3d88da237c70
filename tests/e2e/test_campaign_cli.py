"""``swarmyard campaign`` through the CLI: bad campaign files are refused before anything runs; the shipped 2x2
on the simulated provider completes with intervals and paired comparisons; a campaign killed with SIGKILL resumes
without rerunning a finished trial.

Every trial is a real run: real sandboxes, the in-process control plane and broker, the evaluator scoring the
hidden-code bundle; only the model is simulated (the provider's seeded ``attempts`` behaviour).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "campaigns"
CLI = "from swarmyard.cli.main import main; main()"


def _env(home: Path) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8"}
    for name in ("XDG_CACHE_HOME", "SWARMYARD_STATE_DIR"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def _campaign(cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CLI, "campaign", *args], cwd=cwd, env=_env(cwd),
                          capture_output=True, text=True, timeout=timeout)


SWARM = (EXAMPLES / "hidden-code-simulated.toml").as_posix()
GOOD = f'[campaign]\nname = "c"\nswarm = "{SWARM}"\nseeds = [1, 2]\n[grid]\ncohort = 2\n'


@pytest.mark.parametrize(("text", "field"), [
    ("[grid]\ncohort = 2\n", "campaign"),
    (GOOD.replace('name = "c"\n', ""), "campaign.name"),
    (GOOD.replace('name = "c"', 'name = "../up"'), "campaign.name"),
    (GOOD.replace("seeds = [1, 2]", "seeds = []"), "campaign.seeds"),
    (GOOD.replace("seeds = [1, 2]", "seeds = [1, 1]"), "campaign.seeds"),
    (GOOD.replace("seeds = [1, 2]", "seeds = [-1]"), "campaign.seeds.0"),
    (GOOD.replace("[grid]\ncohort = 2\n", ""), "campaign file"),
    (GOOD.replace("cohort = 2", "cohort = 1"), "grid.cohort"),
    (GOOD + "top_kk = 3\n", "grid.top_kk"),
    (GOOD + "[sweep]\nn = [2, 2]\n", "sweep.n"),
    (GOOD + '[sweep]\nn = [1]\nhistory = "all of it"\n', "sweep.history"),
    (GOOD.replace("seeds = [1, 2]", "seeds = [1, 2]\nbudget_usd = 0.5"), "campaign.budget_usd"),
    (GOOD.replace("seeds = [1, 2]", "seeds = [1, 2]\ncall_cap = 0"), "campaign.call_cap"),
    (GOOD.replace(SWARM, "nope.toml"), "campaign.swarm"),
    (GOOD.replace("seeds = [1, 2]", f'seeds = [1, 2]\ndir = "{"d" * 80}"'), "campaign.dir"),
    ("[campaign\n", "campaign file"),
])
def test_a_bad_campaign_file_exits_1_before_anything_runs(short_tmp: Path, text: str, field: str) -> None:
    (short_tmp / "c.toml").write_text(text)
    done = _campaign(short_tmp, "c.toml", timeout=60)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{field}:" in lines[0] and "config_error" in lines[0], done.stderr
    assert done.stdout == ""
    assert sorted(p.name for p in short_tmp.iterdir()) == ["c.toml"]  # no campaigns/, no run, no store


def test_a_swarm_file_the_campaign_cannot_use_is_refused(short_tmp: Path) -> None:
    bad_swarm = short_tmp / "s.toml"
    bad_swarm.write_text('[goal]\nobjective = "x"\nbudget_usd = "1"\n[tasks]\nplan = 2\n')
    (short_tmp / "c.toml").write_text(GOOD.replace(SWARM, "s.toml"))
    done = _campaign(short_tmp, "c.toml", timeout=60)
    assert done.returncode == 1 and "campaign.swarm:" in done.stderr and "lenses" in done.stderr
    # a field the swarm file gets wrong for one seed only is still found before anything runs
    bad_swarm.write_text(swarm_text().replace('budget_usd = "0.10"', 'budget_usd = "${seed}.x"'))
    done = _campaign(short_tmp, "c.toml", timeout=60)
    assert done.returncode == 1 and "goal.budget_usd" in done.stderr, done.stderr
    # what the host lacks (here the machine baseline the swarm file names) is found before any folder is made
    bad_swarm.write_text(swarm_text().replace("[workers]", '[workers]\nbaseline = "no-such-baseline"'))
    done = _campaign(short_tmp, "c.toml", timeout=60)
    assert done.returncode == 1 and "workers.baseline" in done.stderr, done.stderr
    assert sorted(p.name for p in short_tmp.iterdir()) == ["c.toml", "s.toml"]


def swarm_text() -> str:
    return (EXAMPLES / "hidden-code-simulated.toml").read_text().replace(
        'bundle = "../bundles/hidden-code"', f'bundle = "{(REPO / "examples/bundles/hidden-code").as_posix()}"')


@pytest.mark.slow
def test_the_2x2_on_the_simulated_provider_completes_with_intervals(short_tmp: Path) -> None:
    done = _campaign(short_tmp, str(EXAMPLES / "2x2-simulated.toml"), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    cells = {c["name"]: c for c in result["cells"]}
    assert sorted(cells) == ["cohort3/scored_history", "cohort3/single_draft_refinement", "single/scored_history",
                             "single/single_draft_refinement"]
    assert result["complete"] is True
    assert "running single/scored_history seed 1" in done.stderr  # progress on stderr, the results on stdout
    for cell in cells.values():
        # the example names no seeds: 1-8 on the simulated provider, enough for a trusted paired interval
        assert cell["seeds"] == list(range(1, 9)) and cell["scored"] == 8 and cell["failed"] == 0
        assert cell["ci_low"] <= cell["mean"] <= cell["ci_high"]
        assert 0 < cell["mean"] <= 1_000_000  # the evaluator scored real attempts
        assert cell["calls"] > 0 and cell["wall_s"] > 0
        assert 0 < cell["spend_micro_usd"] <= result["cap"]["budget_micro_usd"]  # the simulated model is priced
        assert cell["calls"] <= result["cap"]["call_cap"]
        assert cell["similarity"] is not None
    assert cells["cohort3/scored_history"]["n"] == 3 and cells["single/scored_history"]["n"] == 1
    assert {c["history"] for c in result["claims"]} == {"scored_history", "single_draft_refinement"}
    assert all(c["verdict"] in ("holds", "reversed", "not shown") for c in result["claims"])  # 8 seeds: tested
    assert len(result["comparisons"]) == 6  # every pair of the four cells
    folder = short_tmp / "campaigns" / "2x2-simulated"
    assert json.loads((folder / "results.json").read_text())["cells"] == result["cells"]
    assert "| single/scored_history | 1 | 8 | 0/8 (0%) |" in (folder / "campaign.md").read_text()
    assert "<table>" in (folder / "campaign.html").read_text()
    assert (folder / "score-vs-tokens.png").read_bytes()[:4] == b"\x89PNG"
    assert len(list((folder / "runs").iterdir())) == 32  # one real run per trial


def _lines(path: Path) -> list[dict[str, object]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


@pytest.mark.slow
def test_a_campaign_killed_mid_way_resumes_without_rerunning_finished_trials(short_tmp: Path) -> None:
    (short_tmp / "c.toml").write_text(
        f'[campaign]\nname = "k"\nswarm = "{SWARM}"\nseeds = [1, 2, 3]\n[sweep]\nn = [1]\n')
    record = short_tmp / "campaigns" / "k" / "trials.jsonl"
    runner = subprocess.Popen([sys.executable, "-c", CLI, "campaign", "c.toml"], cwd=short_tmp, env=_env(short_tmp),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        # kill it once two trials are in the record: the third is under way or about to be
        while len(_lines(record)) < 2:
            with contextlib.suppress(subprocess.TimeoutExpired):
                runner.wait(timeout=0.1)  # waits on the campaign, which must still be running
            assert runner.returncode is None, "the campaign ended before it could be killed"
    finally:
        os.killpg(runner.pid, signal.SIGKILL)
        runner.wait(timeout=60)
    before = _lines(record)
    assert 2 <= len(before) < 6
    done = _campaign(short_tmp, "c.toml", "--resume", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    after = _lines(record)
    assert after[:len(before)] == before  # kept as they were
    keys = [str(line["key"]) for line in after]
    assert len(keys) == len(set(keys)) == 6  # every trial once: none of the finished ones ran again
    result = json.loads(done.stdout)
    assert result["complete"] is True
    by_name = {c["name"]: c for c in result["cells"]}
    assert by_name["best@1"]["seeds"] == by_name["team@1"]["seeds"] == [1, 2, 3]
    finished_runs = {str(line["run_id"]) for line in before}
    assert finished_runs <= {t["run_id"] for c in result["cells"] for t in c["trials"]}
    # a second campaign in the same folder without --resume is refused, and nothing changes
    again = _campaign(short_tmp, "c.toml", timeout=60)
    assert again.returncode == 1 and "already holds a campaign" in again.stderr
    assert _lines(record) == after
    # on a terminal, stderr shows the trials' progress (all six are in the record: nothing runs again)
    shown = _on_a_terminal(short_tmp, "campaign", "c.toml", "--resume")
    assert "6/6" in shown and _lines(record) == after


def _on_a_terminal(cwd: Path, *args: str) -> str:
    """Run the CLI with its stderr on a pseudo-terminal; what it wrote there."""
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", CLI, *args], cwd=cwd, env={**_env(cwd), "TERM": "xterm"},
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the process closed its end
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(timeout=120) == 0, out[-2000:]
    return out.decode("utf-8", "replace")
