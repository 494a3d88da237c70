"""Campaign files that must be refused through the ``swarmyard`` console script: exit 1, one line naming the field,
and nothing made in the folder.

Each was accepted before: ``deadline_s = "5"`` and ``deadline_s = true`` (a string and a boolean coerced to a
number: a campaign of 5-second trials ran), ``deadline_s = inf``; a file nested past Python's recursion limit
(an internal RecursionError); a 2 MB file (parsed whole, then refused on a key only); and, with ``match =
"tokens"`` or ``"calls"``, an allowance that does not split evenly among a cell's workers (``tokens = 3001`` with
a cohort of 7 gave the cohort 2,996 tokens and the single worker 3,001; ``call_cap = 1`` with a cohort of 3 gave
the cohort 3 calls); 5,001 seeds of a 2x2 (20,004 trials, each swarm file built and checked: 56 s and 260 MB
to read, in a file of 20 kB); a sweep n, a cohort or a cell of 100,000 workers (a cell's count was not bounded;
the sweep's took 15 s and 600 MB to be refused). A bad key of a [[cells]] entry was blamed on the swarm file
("campaign.swarm: s.toml: workers.bogus: is not a known setting"): it is named where it is, cells.a.workers.bogus.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SWARM = (REPO / "examples" / "campaigns" / "hidden-code-simulated.toml").read_text().replace(
    'bundle = "../bundles/hidden-code"', f'bundle = "{(REPO / "examples/bundles/hidden-code").as_posix()}"')
HEAD = '[campaign]\nname = "c"\nswarm = "s.toml"\nseeds = [1, 2]\n'
DEEP = HEAD + "[grid]\n[[cells]]\nname = \"a\"\nworkers = " + "{a=" * 3000 + "1" + "}" * 3000 + "\n"
HUGE = HEAD + "[grid]\n[[cells]]\nname = \"a\"\nlead = { x = \"" + "a" * (2 << 20) + "\" }\n"


@pytest.mark.parametrize(("text", "field"), [
    (HEAD + 'deadline_s = "5"\n[grid]\n', "campaign.deadline_s"),
    (HEAD + "deadline_s = true\n[grid]\n", "campaign.deadline_s"),
    (HEAD + "deadline_s = inf\n[grid]\n", "campaign.deadline_s"),
    (HEAD + 'call_cap = "40"\n[grid]\n', "campaign.call_cap"),
    (DEEP, "campaign file"),
    (HUGE, "campaign file"),
    (HEAD + 'match = "tokens"\ntokens = 3001\n[grid]\ncohort = 7\n', "campaign.tokens"),
    (HEAD + 'match = "tokens"\ntokens = 2\n[grid]\ncohort = 3\n', "campaign.tokens"),
    (HEAD + 'match = "calls"\ncall_cap = 1\n[grid]\ncohort = 3\n', "campaign.call_cap"),
    (HEAD + 'match = "calls"\ncall_cap = 10\n[sweep]\nn = [1, 4]\n', "campaign.call_cap"),
    (HEAD.replace("seeds = [1, 2]", f"seeds = [{', '.join(map(str, range(5001)))}]") + "[grid]\n", "campaign.seeds"),
    (HEAD + "[grid]\ncohort = 100000\n", "grid.cohort"),
    (HEAD + "[sweep]\nn = [100000]\n", "sweep.n.0"),
    (HEAD + '[[cells]]\nname = "a"\nworkers = { count = 100000 }\n', "cells.a"),
    (HEAD + '[[cells]]\nname = "a"\nworkers = { bogus = 2 }\n', "cells.a.workers.bogus"),
    (HEAD + '[[cells]]\nname = "a"\nlead = { max_steps = "2" }\n', "cells.a.lead.max_steps"),
])
def test_a_bad_campaign_file_is_refused_by_the_console_script(short_tmp: Path, text: str, field: str) -> None:
    (short_tmp / "s.toml").write_text(SWARM)
    (short_tmp / "c.toml").write_text(text)
    script = shutil.which("swarmyard")
    assert script is not None, "the swarmyard console script is installed"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8"}
    done = subprocess.run([script, "campaign", "c.toml"], cwd=short_tmp, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{field}:" in lines[0] and "config_error" in lines[0], done.stderr[-2000:]
    assert done.stdout == ""
    assert sorted(p.name for p in short_tmp.iterdir()) == ["c.toml", "s.toml"]  # no campaigns/, no run


def test_an_even_split_of_the_tokens_is_accepted(short_tmp: Path) -> None:
    """The check refuses only remainders: 3,003 tokens split among 1 and 7 workers is read (the file is only
    loaded here, nothing runs)."""
    from swarmyard.campaign import load_campaign

    (short_tmp / "s.toml").write_text(SWARM)
    (short_tmp / "c.toml").write_text(HEAD + 'match = "tokens"\ntokens = 3003\n[grid]\ncohort = 7\n')
    campaign = load_campaign(short_tmp / "c.toml", cwd=short_tmp)
    assert {c.name: c.allowance for c in campaign.cells}["cohort7/scored_history"] == 3003
