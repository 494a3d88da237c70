"""``swarmyard bench agents``: the seed's boxd script, with only its import changed, on the embedded model with no
key: three scouts and a lead, each ``claude -p`` in a real machine of its own. Run twice, each in a fresh
process: the first with an empty prompt-start cache (what a first run on a new host pays, past assembling the
model), the second with the starts the first saved (see ``swarmyard.broker.providers.prefixes``).

Each run is the ported script executed as a user's program in a subprocess (``runpy``), with a private cache
folder holding only a link to the assembled model, a private temp folder, and no provider key in its
environment; after it ends, the runner reports the text of each scout's report and the lead's answer from the
script's own variables, and each machine's model calls with their tokens from the embedded plane's store. A run counts as complete when the script exits 0 and every ``claude -p`` answered
something. Targets: the first run in 10 minutes, the second in 3, on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarmyard.bench.children import child_env
from swarmyard.bench.result import BenchResult, BenchRow

#: The seed's script as its shape is described (three scouts and a lead, each ``machines.create``,
#: ``wait_until_ready``, ``exec`` of ``claude -p "..." --dangerously-skip-permissions`` with ``timeout=600``,
#: ``files.upload`` of the reports to ``/home/boxd/reports.md``, ``delete``), written against boxd 0.2.19's SDK
#: names; the seed's own text was not available to this project, so this is a reconstruction, not a copy.
SEED = '''\
import os

from boxd import Boxd

boxd = Boxd(api_key=os.environ["BOXD_API_KEY"])

QUESTION = "Should a small team bet on building an on-device speech model product in the next year?"
SCOUTS = {
    "market": "Estimate the market size for on-device speech models: who buys, how many, and how fast it grows.",
    "models": "Name the strongest open-source on-device speech models and what each is good and bad at.",
    "risks": "List the risks that would kill the bet, most likely first, each with an early warning sign.",
}

reports = []
for lens, brief in SCOUTS.items():
    machine = boxd.machines.create(f"scout-{lens}")
    boxd.machines.wait_until_ready(machine.id)
    result = boxd.machines.exec(
        machine.id,
        f'claude -p "{QUESTION} {brief}" --dangerously-skip-permissions',
        timeout=600,
    )
    reports.append(f"## {lens}\\n\\n{result.stdout}")
    boxd.machines.delete(machine.id)

lead = boxd.machines.create("lead")
boxd.machines.wait_until_ready(lead.id)
boxd.machines.files.upload(lead.id, "/home/boxd/reports.md", "\\n\\n".join(reports))
result = boxd.machines.exec(
    lead.id,
    'claude -p "Read /home/boxd/reports.md and write one recommendation: go or no-go, and why." '
    "--dangerously-skip-permissions",
    timeout=600,
)
print(result.stdout)
boxd.machines.delete(lead.id)
'''

IMPORT = "from boxd import Boxd"
CONSTRUCTION = 'boxd = Boxd(api_key=os.environ["BOXD_API_KEY"])'
#: The seed's scouts, in its order.
SCOUTS = ("market", "models", "risks")
#: Targets of the issue, on 2 cores.
FIRST_RUN_TARGET_S = 600.0
SECOND_RUN_TARGET_S = 180.0
#: A run past this is stopped: four ``exec`` calls of at most 600 s each, and the machines around them.
RUN_TIMEOUT_S = 2700.0

#: Runs the script as a program and then writes what its variables hold: each scout's report and the answer,
#: and, from the embedded plane's store before the client closes it, each machine's model calls and their tokens
#: (one reservation a call, settled with the tokens the broker counted).
_RUNNER = """\
import json, runpy, sys
done = runpy.run_path(sys.argv[1], run_name="__main__")
reports = {r.split("\\n", 1)[0].removeprefix("## "): r.split("\\n\\n", 1)[1] for r in done["reports"]}
calls = {}
plane = done["boxd"]._plane
if plane is not None and plane._owned is not None:
    plane._owned.broker.wait_settled(30)
    store = plane._owned.store
    names = {t.id: t.title.removeprefix("machine ") for t in store.list_tasks(plane.goal_id)}
    for r in sorted(store.list_reservations(plane.goal_id), key=lambda r: r.created_at):
        calls.setdefault(names.get(r.task_id, r.task_id), []).append([r.input_tokens, r.output_tokens])
with open(sys.argv[2], "w") as out:
    json.dump({"scouts": reports, "lead": done["result"].stdout, "calls": calls}, out)
"""


def ported(construction: str = "boxd = Boxd()") -> str:
    """The seed with swarmyard's import and ``construction`` in place of boxd's: nothing else changes."""
    assert SEED.count(IMPORT) == 1 and SEED.count(CONSTRUCTION) == 1
    return SEED.replace(IMPORT, "from swarmyard.boxd import Boxd").replace(CONSTRUCTION, construction)


@dataclass(frozen=True, slots=True)
class SeedRun:
    """One run of the ported script: its wall time, its exit, what each ``claude -p`` answered, and each machine's
    model calls as (input tokens, output tokens), in order."""

    wall_s: float
    exit_code: int | None
    answers: dict[str, str]
    stderr_tail: str
    calls: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """The script exited 0 and every scout and the lead answered something."""
        names = (*SCOUTS, "lead")
        return self.exit_code == 0 and all(self.answers.get(name, "").strip() for name in names)


def run_seed(folder: Path, cache: Path, *, timeout_s: float = RUN_TIMEOUT_S) -> SeedRun:
    """The ported script run once in ``folder`` with ``cache`` as its user cache folder (no key anywhere)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="sy-ag-"))  # short: the embedded plane's sockets live under it
    script, runner, report = folder / "swarm.py", folder / "runner.py", folder / "answers.json"
    script.write_text(ported())
    runner.write_text(_RUNNER)
    env = child_env() | {"XDG_CACHE_HOME": str(cache), "TMPDIR": str(tmp)}
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, str(runner), str(script), str(report)], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=timeout_s)
        exit_code: int | None = done.returncode
        stderr = done.stderr
    except subprocess.TimeoutExpired as exc:
        exit_code = None
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    wall = time.monotonic() - started
    answers: dict[str, str] = {}
    calls: dict[str, list[tuple[int, int]]] = {}
    if exit_code == 0 and report.is_file():
        saved: dict[str, Any] = json.loads(report.read_text())
        answers = {**{str(k): str(v) for k, v in saved["scouts"].items()}, "lead": str(saved["lead"])}
        calls = {str(k): [(int(i), int(o)) for i, o in v] for k, v in saved.get("calls", {}).items()}
    return SeedRun(wall, exit_code, answers, stderr[-2000:], calls)


def cache_with_model(folder: Path) -> Path:
    """A user cache folder of its own whose model folder links to the assembled default model (assembled now in
    the usual cache if it is not yet): its prompt-start cache starts empty, the user's is left alone."""
    from swarmyard.broker.providers.local import assemble_qwen

    usual = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "swarmyard" / "models"
    model = assemble_qwen(usual).path
    cache = folder / "cache"
    models = cache / "swarmyard" / "models"
    models.mkdir(parents=True)
    (models / model.name).symlink_to(model)
    return cache


def run(quick: bool = False, **options: object) -> BenchResult:
    """The seed script twice (once with ``quick``): the first with no saved prompt starts, the second after it."""
    result = BenchResult("agents")
    folder = Path(tempfile.mkdtemp(prefix="swarmyard-bench-agents-"))
    try:
        cache = cache_with_model(folder)
        load_before = os.getloadavg()[0]
        runs: dict[str, SeedRun] = {}
        for name, target in (("first", FIRST_RUN_TARGET_S), ("second", SECOND_RUN_TARGET_S))[: 1 if quick else 2]:
            seed = runs[name] = run_seed(folder / name, cache)
            result.add(BenchRow(f"{name} run, 3 scouts + lead", seed.wall_s, "s",
                                target=f"<= {target:.0f} s, every answer non-empty"))
            result.add(BenchRow(f"{name} run, claude -p answered", float(sum(
                bool(seed.answers.get(n, "").strip()) for n in (*SCOUTS, "lead"))), "of 4"))
            result.add(BenchRow(f"{name} run, model calls", float(sum(map(len, seed.calls.values()))), "calls",
                                target="one a scout, two for the lead (it reads the reports)"))
            if not seed.complete:
                result.notes.append(f"{name} run incomplete (exit {seed.exit_code}): {seed.stderr_tail[-600:]}")
        prefixes = sorted((cache / "swarmyard" / "models" / "prefixes").glob("*.kv"))
        result.summary = {
            "runs": {name: {"wall_s": round(seed.wall_s, 1), "exit_code": seed.exit_code, "complete": seed.complete,
                            "answer_chars": {k: len(v) for k, v in seed.answers.items()},
                            "calls": {k: len(v) for k, v in seed.calls.items()},
                            "input_tokens": {k: [i for i, _ in v] for k, v in seed.calls.items()},
                            "output_tokens": {k: [o for _, o in v] for k, v in seed.calls.items()},
                            "within_target": seed.complete and seed.wall_s <= (
                                FIRST_RUN_TARGET_S if name == "first" else SECOND_RUN_TARGET_S)}
                     for name, seed in runs.items()},
            "saved_prompt_starts": len(prefixes),
            "saved_prompt_bytes": sum(p.stat().st_size for p in prefixes),
            "host": {"cpus": os.cpu_count(), "load_before": round(load_before, 2),
                     "load_after": round(os.getloadavg()[0], 2)},
        }
        result.notes.append("the embedded model is a 0.5B: the answers are short and often off the point; this "
                            "measures that Claude Code completes on it, not what it says")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return result
