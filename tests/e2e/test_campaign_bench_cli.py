"""``swarmyard bench campaign`` refuses what it cannot run before any trial starts, through the console script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CLI = "from swarmyard.cli.main import main; main()"


def _bench(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd), "LANG": "C.UTF-8"}
    return subprocess.run([sys.executable, "-c", CLI, "bench", "campaign", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


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
