"""What the console script says where a user goes wrong or looks for help.

- a mistyped key of a swarm file is refused with the key it is closest to (``did you mean``), in any table;
- help text that names a TOML table (``[providers]``, ``[run]``) shows it, rather than rich eating it as markup.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SWARMYARD = Path(sys.executable).with_name("swarmyard")
_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "COLUMNS": "250"}

_SWARM = """
[goal]
objective = "o"
budget_usd = "1"
[[tasks.lenses]]
title = "t"
prompt = "p"
[workers]
count = 1
concurrency = 1
model = "m"
[lead]
model = "m"
[providers.sim]
kind = "simulated"
models = ["m"]
[providers.sim.prices.m]
input_usd_per_mtok = "1"
output_usd_per_mtok = "2"
[run]
runs_dir = "runs"
"""


@pytest.mark.parametrize(("typo", "field", "meant"), [
    (("concurrency = 1", "concurency = 1"), "workers.concurency", "concurrency"),
    (('budget_usd = "1"', 'budget_usd = "1"\ncall_capp = 3'), "goal.call_capp", "call_cap"),
    (('input_usd_per_mtok = "1"', 'input_usd_per_mtk = "1"'), "providers.sim.prices.m.input_usd_per_mtk",
     "input_usd_per_mtok"),
])
def test_a_mistyped_key_is_refused_with_the_key_it_is_closest_to(tmp_path: Path, typo: tuple[str, str],
                                                                  field: str, meant: str) -> None:
    (tmp_path / "swarm.toml").write_text(_SWARM.replace(*typo))
    done = subprocess.run([str(SWARMYARD), "run", "swarm.toml"], cwd=tmp_path, env={**_ENV, "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert f"{field}: is not a known setting (did you mean '{meant}'?)" in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()


def test_a_key_like_no_other_gets_no_guess(tmp_path: Path) -> None:
    (tmp_path / "swarm.toml").write_text(_SWARM.replace("[run]", "[run]\nzzzz = 1"))
    done = subprocess.run([str(SWARMYARD), "run", "swarm.toml"], cwd=tmp_path, env={**_ENV, "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "run.zzzz: is not a known setting" in done.stderr
    assert "did you mean" not in done.stderr


@pytest.mark.parametrize(("command", "shown"), [
    (["serve"], "this file's [providers] table"),
    (["broker", "serve"], "this file's [providers] table"),
    (["machines", "serve"], "A file with a [providers] table"),
    (["runs", "list"], "([run] runs_dir of the swarm file)"),
])
def test_help_that_names_a_toml_table_shows_it(command: list[str], shown: str) -> None:
    done = subprocess.run([str(SWARMYARD), *command, "--help"], env=_ENV, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    flat = " ".join(line.strip(" │") for line in done.stdout.splitlines())
    assert shown in " ".join(flat.split()), done.stdout
