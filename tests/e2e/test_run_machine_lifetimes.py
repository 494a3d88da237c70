"""A run's machines through ``swarmyard run``: how long each lives, and how many live at once.

- 300 workers at concurrency 16 on the simulated provider complete with a report (a run of more workers than
  the machine cap used to finish its tasks and hang, its lead never started).
- ``[workers] machine``: by default a worker's machine lives exactly as long as its task, so a file an agent
  wrote is gone for the next task; ``"per_slot"`` keeps a slot's machine (and its disk) for the slot's next
  task, and at ``max_machines`` deletes the one idle longest to make room.

Each run is the console script in a subprocess started from an ordinary folder, with real sandboxes; what the
run did is read back from its store and its audit events.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_swarm_sandboxed import events_of

from rigs.outcomes import assert_simulated_lead_ended
from swarmyard.domain import Finding, Reservation, ReservationState, Task
from swarmyard.machines.supervised import default_root
from swarmyard.store import open_store

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

CLI = "from swarmyard.cli.main import main; main()"


@pytest.fixture
def folder() -> Iterator[Path]:
    """An ordinary folder with a short path (the plane's Unix socket lives in the run folder)."""
    path = Path(tempfile.mkdtemp(prefix="sy-m-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_cli(folder: Path, swarm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``swarmyard run SWARM --quiet ARGS`` from ``folder``, with a minimal environment (no provider key)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    if "PYTHONPATH" in os.environ:  # swarmyard as this interpreter finds it
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run([sys.executable, "-c", CLI, "run", str(swarm), "--quiet", *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=3600)


def the_run(folder: Path) -> Path:
    (run_dir,) = (folder / "runs").iterdir()
    return run_dir


def tasks_and_findings(run_dir: Path) -> tuple[list[Task], list[Finding], list[Reservation]]:
    """The run's tasks, findings and holds, read back from its store."""
    goal = json.loads((run_dir / "run.json").read_text())["goal_id"]
    store = open_store(f"sqlite:///{run_dir / 'store.db'}")
    try:
        return store.list_tasks(goal), store.read_findings(goal, limit=10_000), store.list_reservations(goal)
    finally:
        store.close()


def machine_events(run_dir: Path) -> list[tuple[str, dict[str, object]]]:
    """(kind, data) of every machine.created / machine.deleted event, in the order they happened."""
    out = []
    for event in events_of(run_dir, "machine.created") + events_of(run_dir, "machine.deleted"):
        body = json.loads(event.body)
        out.append((event.id, event.kind, body.get("data", body)))
    return [(kind, data) for _, kind, data in sorted(out, key=lambda item: item[0])]


def most_alive(events: list[tuple[str, dict[str, object]]]) -> int:
    alive, peak = 0, 0
    for kind, _ in events:
        alive += 1 if kind == "machine.created" else -1
        peak = max(peak, alive)
    return peak


def simulated_swarm(folder: Path, *, lenses: int, workers: int, concurrency: int) -> Path:
    """The simulated provider (its answers become partial findings), one step per agent."""
    tables = "".join(f'[[tasks.lenses]]\ntitle = "lens {i}"\n' for i in range(lenses))
    path = folder / "swarm.toml"
    path.write_text(f"""
[goal]
objective = "Map the field, one lens a worker."
budget_usd = "1"
call_cap = {10 * lenses + 10}
deadline_s = 3000
{tables}
[policy]
kind = "team"
[workers]
count = {workers}
concurrency = {concurrency}
max_steps = 1
model = "sim"
[lead]
model = "sim"
max_steps = 1
[providers.sim]
kind = "simulated"
models = ["sim"]
[run]
runs_dir = "runs"
sandbox = "local"
""")
    return path


def test_300_workers_at_concurrency_16_complete_with_a_report(folder: Path) -> None:
    swarm = simulated_swarm(folder, lenses=300, workers=300, concurrency=16)
    done = run_cli(folder, swarm)
    assert_simulated_lead_ended(done.returncode, done.stderr)
    run_dir = the_run(folder)
    assert (run_dir / "report.md").is_file() and (run_dir / "report.html").is_file()
    tasks, findings, holds = tasks_and_findings(run_dir)
    states = Counter(t.state.value for t in tasks)
    assert states == {"done": 301}, states  # the 300 lenses and the synthesis
    (synthesis,) = [f for f in findings if f.group == "lead"]
    # one step of the simulated model reaches no result, so every finding is a placeholder, the lead's too,
    # and a placeholder rests on nothing
    assert synthesis.citations == () and synthesis.body.startswith("No result was reached for 'synthesis'")
    # every model call's hold settled, none left held or unknown
    assert holds and Counter(h.state for h in holds) == {ReservationState.SETTLED: len(holds)}
    events = machine_events(run_dir)
    created = [str(d["machine"]) for k, d in events if k == "machine.created"]
    deleted = [str(d["machine"]) for k, d in events if k == "machine.deleted"]
    assert len(created) >= 301 and sorted(created) == sorted(deleted)  # every machine deleted, each once
    # released as their tasks ended: never more alive than agents ran at once (16, and the lead after them)
    assert most_alive(events) <= 16
    leftover = [m for m in created if (default_root() / "m" / str(m)).exists()]
    assert leftover == []


SCRIPT_WORKER = "scripted-worker"
SCRIPT_LEAD = "scripted-lead"
#: Every task's agent looks for the file an earlier task's agent left, then leaves it; its finding says which.
PROBE = ("if test -e carried.txt; then echo disk-carried-over; else echo disk-fresh; fi; "
         "echo from-an-earlier-task > carried.txt")


def carry_swarm(folder: Path, *, lenses: int, machine: str | None, workers: int = 1,
                max_machines: int | None = None) -> Path:
    """The scripted provider, one agent at a time (the replies are one queue, used in order)."""
    agent = [{"tool_calls": [{"name": "shell", "arguments": {"command": PROBE}}]},
             {"tool_calls": [{"name": "submit_finding", "arguments": {"title": "probe",
                                                                      "body": "{{last_message}}"}}]}]
    lead = [{"tool_calls": [{"name": "submit_finding", "arguments": {"title": "synthesis",
                                                                     "body": "Every probe reported."}}]}]
    (folder / "replies.json").write_text(json.dumps({SCRIPT_WORKER: agent * lenses, SCRIPT_LEAD: lead}))
    tables = "".join(f'[[tasks.lenses]]\ntitle = "lens {i}"\n' for i in range(lenses))
    extra = (f'machine = "{machine}"\n' if machine else "") + (
        f"max_machines = {max_machines}\n" if max_machines else "")
    path = folder / "swarm.toml"
    path.write_text(f"""
[goal]
objective = "Probe the disk."
budget_usd = "1"
call_cap = 100
deadline_s = 600
{tables}
[policy]
kind = "team"
[workers]
count = {workers}
concurrency = 1
max_steps = 4
model = "{SCRIPT_WORKER}"
{extra}
[lead]
model = "{SCRIPT_LEAD}"
[providers.script]
kind = "scripted"
models = ["{SCRIPT_WORKER}", "{SCRIPT_LEAD}"]
replies = "replies.json"
[run]
runs_dir = "runs"
sandbox = "local"
""")
    return path


def probes(run_dir: Path) -> list[str]:
    """What each task's probe found, in the order the tasks were done."""
    tasks, findings, _ = tasks_and_findings(run_dir)
    work = {t.id for t in tasks if t.group != "lead"}
    return ["carried" if "disk-carried-over" in f.body else "fresh" if "disk-fresh" in f.body else f.body
            for f in sorted(findings, key=lambda f: f.created_at) if f.task_id in work]


@pytest.mark.parametrize("machine", [None, "per_task"])
def test_by_default_a_machine_lives_as_long_as_its_task(folder: Path, machine: str | None) -> None:
    done = run_cli(folder, carry_swarm(folder, lenses=2, machine=machine))
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = the_run(folder)
    assert probes(run_dir) == ["fresh", "fresh"]  # the file task 1 wrote is absent for task 2
    events = machine_events(run_dir)
    assert most_alive(events) == 1
    # one machine per agent run (the two tasks and the lead), each deleted before the next was made
    assert [k for k, _ in events] == ["machine.created", "machine.deleted"] * 3


def test_per_slot_keeps_a_slot_machine_and_its_disk_for_its_next_task(folder: Path) -> None:
    done = run_cli(folder, carry_swarm(folder, lenses=2, machine="per_slot"))
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = the_run(folder)
    assert probes(run_dir) == ["fresh", "carried"]
    events = machine_events(run_dir)
    worker_machines = {d["machine"] for k, d in events if k == "machine.created" and d["slot"] == "worker-0"}
    assert len(worker_machines) == 1  # both tasks ran in it
    assert sorted(str(d["machine"]) for k, d in events if k == "machine.deleted") == sorted(
        str(d["machine"]) for k, d in events if k == "machine.created")


def test_per_slot_at_the_cap_deletes_the_longest_idle_machine_and_goes_on(folder: Path) -> None:
    # one machine at most: the lead needs the only place, so the worker's idle machine is deleted for it
    done = run_cli(folder, carry_swarm(folder, lenses=2, machine="per_slot", max_machines=1))
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = the_run(folder)
    assert probes(run_dir) == ["fresh", "carried"]
    events = machine_events(run_dir)
    assert most_alive(events) == 1
    assert [(k, d["slot"]) for k, d in events] == [("machine.created", "worker-0"), ("machine.deleted", "worker-0"),
                                                   ("machine.created", "lead"), ("machine.deleted", "lead")]
