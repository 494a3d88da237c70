"""A campaign folder has one owner and a record that must read as written, through ``swarmyard campaign``:

- while a process holds the folder (a campaign running in it), a second ``swarmyard campaign`` on it exits 1 with
  one line, ``campaign_busy``, and runs nothing (two ran every trial each, doubling the spend);
- a record line that is not a whole trial (``"score": "abc"``) or records a finished trial a second time is
  refused by its line number (was an internal ValueError, or the second line silently replacing the first).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rigs.cli import run_cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "campaigns"
SWARM = (EXAMPLES / "hidden-code-simulated.toml").as_posix()
CAMPAIGN = f'[campaign]\nname = "c"\nswarm = "{SWARM}"\nseeds = [1]\n[sweep]\nn = [1]\n'
HOLD = ("import sys; from pathlib import Path; from swarmyard.campaign.record import hold\n"
        "with hold(Path(sys.argv[1])):\n    print('held', flush=True); sys.stdin.read()")


@pytest.fixture
def folder(short_tmp: Path) -> Path:
    """The campaign's folder (each trial's plane socket lives under it: a short one)."""
    (short_tmp / "c.toml").write_text(CAMPAIGN)
    return short_tmp


def _campaign(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("campaign", "c.toml", *args, cwd=cwd)


@pytest.mark.parametrize("args", [(), ("--resume",)])
def test_a_second_campaign_process_on_a_folder_is_refused(folder: Path, args: tuple[str, ...]) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder / "campaigns" / "c")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        out = _campaign(folder, *args)
    finally:
        holder.communicate("")
    assert out.returncode == 1, out.stderr
    assert "campaign_busy" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (folder / "campaigns" / "c" / "runs").exists()


def _record(folder: Path) -> Path:
    out = _campaign(folder)
    assert out.returncode == 0, out.stderr[-2000:]
    return folder / "campaigns" / "c" / "trials.jsonl"


@pytest.mark.bwrap
@pytest.mark.slow
def test_a_tampered_or_doubled_record_is_refused_by_its_line(folder: Path) -> None:
    trials = _record(folder)
    good = trials.read_text()
    first = json.loads(good.splitlines()[0])
    added = f"line {len(good.splitlines()) + 1}"
    for line, says in ((json.dumps({**first, "score": "abc"}), "score"),
                       (json.dumps({**first, "score": 999_999_999}), "recorded already on line 1")):
        trials.write_text(good + line + "\n")
        out = _campaign(folder, "--resume", "--json")
        assert out.returncode == 1, out.stderr
        assert "campaign_record_error" in out.stderr and added in out.stderr and says in out.stderr, out.stderr
        assert "internal" not in out.stderr
    trials.write_text(good)
    assert _campaign(folder, "--resume", "--json").returncode == 0
