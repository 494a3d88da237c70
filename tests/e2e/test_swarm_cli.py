"""``swarmyard run`` with bad swarm files: one clear line naming the field, exit 1, nothing started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

GOOD = '[goal]\nobjective = "x"\nbudget_usd = "1"\n[tasks]\nplan = 2\n'


def _run(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "swarm.toml"
    path.write_text(text)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    return subprocess.run(
        [sys.executable, "-c", "from swarmyard.cli.main import main; main()", "run", str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[tasks]\nplan = 2\n", "goal"),
        (GOOD.replace('objective = "x"\n', ""), "goal.objective"),
        (GOOD.replace('"1"', "true"), "goal.budget_usd"),
        (GOOD.replace('"1"', '"-5"'), "goal.budget_usd"),
        (GOOD.replace("plan = 2", 'plan = "two"'), "tasks.plan"),
        (GOOD + '[policy]\nkind = "anarchy"\n', "policy.kind"),
        (GOOD + '[workers]\nagent = "clippy"\n', "workers.agent"),
        (GOOD + "[workers]\ncount = 0\n", "workers.count"),
        (GOOD.replace('"1"', '"1"\ncall_cap = -3'), "goal.call_cap"),
        (GOOD.replace('"1"', '"1"\ndeadline_s = -60'), "goal.deadline_s"),
        (GOOD.replace('"1"', '"1"\nmax_depth = -1'), "goal.max_depth"),
        (GOOD.replace('"1"', "0.5"), "goal.budget_usd"),
        (GOOD + '[workers]\ncount = "three"\n', "workers.count"),
        (GOOD + "[workers]\nexec_timeout_s = -1\n", "workers.exec_timeout_s"),
        (GOOD + "[workers]\nconut = 3\n", "workers.conut"),
        (GOOD + '[lead]\nagent = "clippy"\n', "lead.agent"),
        ('[goal]\nobjective = "x"\nbudget_usd = "1"\n[[tasks.lenses]]\nprompt = "p"\n', "tasks.lenses.0.title"),
        (GOOD + '[providers.local]\nkind = "local"\nmodels = ["gpt-9"]\n', "providers.local"),
        (GOOD + '[workers]\nmodel = "nope"\n', "workers.model"),
        (GOOD + '[providers.x]\nkind = "telepathy"\nmodels = ["m"]\n', "providers.x.kind"),
    ],
)
def test_bad_swarm_file_exits_1_naming_the_field(tmp_path: Path, text: str, field: str) -> None:
    done = _run(tmp_path, text)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{field}:" in lines[0] and "config_error" in lines[0]
    assert done.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["swarm.toml"]  # no runs/, no store, no machine


def test_missing_swarm_file(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from swarmyard.cli.main import main; main()",
            "run",
            str(tmp_path / "nope.toml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "no such swarm file" in done.stderr
