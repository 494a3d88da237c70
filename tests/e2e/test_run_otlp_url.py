"""``swarmyard run --otlp URL`` refuses a URL the exporter could only fail on (``http://[::1``, a bad port, no
host), and ``--otlp-content`` without a collector, in one line, exit 1, before the run starts: no run folder, no
goal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_SWARMYARD = str(Path(sys.executable).parent / "swarmyard")  # the console script


@pytest.mark.parametrize("bad", ["http://[::1", "http://127.0.0.1:99999", "http://127.0.0.1:x", "http://",
                                 "http://127.0.0.1:0", None])
def test_a_bad_otlp_url_stops_the_run_before_it_starts(tmp_path: Path, bad: str | None) -> None:
    (tmp_path / "swarm.toml").write_text(f"""
[goal]
objective = "o"
budget_usd = "1"
call_cap = 5
[[tasks.lenses]]
title = "t"
prompt = "p"
[workers]
count = 1
model = "sim-1"
[lead]
model = "sim-1"
[providers.sim]
kind = "simulated"
models = ["sim-1"]
[run]
runs_dir = "{tmp_path / 'runs'}"
sandbox = "process"
""")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "XDG_STATE_HOME": str(tmp_path / "state")}
    # None: message content asked for (--otlp-content) with no collector to send it to
    flags = ["--otlp", bad] if bad is not None else ["--otlp-content"]
    done = subprocess.run([_SWARMYARD, "run", str(tmp_path / "swarm.toml"), *flags], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    said = "OTLP endpoint" if bad is not None else "--otlp-content needs a collector"
    assert said in done.stderr and done.stderr.count("\n") == 1, done.stderr[-2000:]
    assert not (tmp_path / "runs").exists()
