"""``swarmyard runs show`` refuses what is not a run id (a trailing newline, a name too long for a folder, a
path) in one line, exit 1, before it looks in the runs folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

_SWARMYARD = str(Path(sys.executable).parent / "swarmyard")  # the console script


@pytest.mark.parametrize("bad", ["abc\n", "x" * 5000, "../runs", ".", "a b", ""])
def test_runs_show_refuses_what_is_not_a_run_id(tmp_path: Path, bad: str) -> None:
    (tmp_path / "runs").mkdir()
    done = subprocess.run([_SWARMYARD, "runs", "show", bad, "--runs-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "not a run id" in done.stderr and done.stderr.count("\n") == 1, done.stderr[:300]
    assert len(done.stderr) < 200
