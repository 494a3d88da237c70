"""The reconciliation benchmark on the embedded Qwen 0.5B model, end to end through ``swarmyard run --json``.

The shipped ``examples/reconciliation/swarm.toml`` (governed workers whose flow is the WASI csvdiff over their shard,
then a finding that attaches its answer; a lead that merges the findings with sqlquery and submits the merged list
as an artifact) runs on an instance of a seed no example uses, generated here by the family's generator, in real
bubblewrap machines. The score is the evaluator's holdout score of the lead's artifact: all 15 records, within the
seed's reference run's 22 model calls and 44,726 tokens, with no hold left and no provider key in any machine; the
run prints its figures (the JSON's every field, the table's every row).

What a run of the same file on SmolLM2 would show (the run completes, every worker and the lead ask the model,
the figures are printed) is asserted here on the file's own model; a providers table naming SmolLM2 is served in
tests/integration/test_broker_local.py.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from rigs.model_runs import model_env
from swarmyard.families import generate, reconciliation

pytestmark = [
    pytest.mark.model,
    pytest.mark.slow,
    pytest.mark.bwrap,
]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reconciliation"
#: A seed of the family that no shipped example uses.
SEED = 7
#: The seed's reference run (a large hosted model): its model calls and tokens (in + out).
SEED_CALLS, SEED_TOKENS = 22, 44_726


def test_the_embedded_model_finds_all_fifteen_records_of_an_unseen_seed(short_tmp: Path) -> None:
    generate("reconciliation", SEED, short_tmp / f"seed-{SEED}")
    text = (EXAMPLE / "swarm.toml").read_text()
    assert text.count('"seed-1') == 2  # the instance's tasks and its bundle
    swarm = short_tmp / "swarm.toml"
    swarm.write_text(text.replace('"seed-1', f'"seed-{SEED}')
                     + f'\n[run]\nruns_dir = "{short_tmp / "runs"}"\nsandbox = "local"\n')
    env = model_env(short_tmp)  # the model assembled once for the host, linked into a cache of this run's own
    # the figures table as a terminal as wide as its rows shows it: at rich's default 80 columns off a terminal,
    # its longest row names wrap onto two lines
    env["COLUMNS"] = "200"
    # no timeout of ours: the swarm file's deadline and each agent's exec timeout bound the run
    done = subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm), "--json"], cwd=short_tmp,
                          env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout)
    print(done.stderr[-2500:])  # the run's table beside the seed's (shown with pytest -rP)
    truth = reconciliation.answer(SEED)
    [run_dir] = (short_tmp / "runs").iterdir()
    with sqlite3.connect(run_dir / "store.db") as db:
        tasks = dict(db.execute("SELECT id, title FROM tasks").fetchall())
        findings = db.execute("SELECT task_id, body, citations FROM findings").fetchall()
    by_title = {tasks[task]: (body, json.loads(cites)) for task, body, cites in findings}
    shards = {title: found for title, found in by_title.items() if title.startswith("shard ")}
    assert len(shards) == 10
    # each shard's finding cites the tool call it rests on (posted on its board), and together they are the truth
    assert all(any(c["kind"] == "post" for c in cites) for _, cites in shards.values()), shards
    assert sorted(i for body, _ in shards.values() for i in re.findall(r"TX-[0-9]{5}", body)) == truth
    synthesis, cites = by_title["synthesis"]
    assert re.findall(r"TX-[0-9]{5}", synthesis) == truth  # merged: sorted, each once
    assert any(c["kind"] == "artifact" for c in cites)
    assert figures["score"] == 1_000_000, done.stderr[-3000:]
    assert set(figures) >= {"score", "wall_s", "calls", "tokens_in", "tokens_out", "spend_micro_usd",
                            "leftover_holds", "keys_found"}
    # every shard's worker and the lead asked the model at least once (how often more is the model's choice)
    assert figures["calls"] >= len(shards) + 1 and figures["tokens_in"] > 0, figures
    assert figures["calls"] <= SEED_CALLS, figures
    assert figures["tokens_in"] + figures["tokens_out"] <= SEED_TOKENS, figures
    assert (figures["leftover_holds"], figures["keys_found"]) == (0, 0)
    # no key held, so none could be found: the table says so rather than a bare 0
    assert figures["keys_held"] is False and "0 (no key held)" in done.stderr
    for row in ("wall time", "time per worker", "model calls", "settled spend", "leftover holds",
                "provider keys found in sandboxes"):
        assert row in done.stderr, row
