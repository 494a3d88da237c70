"""The runner end to end in real bubblewrap sandboxes, on the scripted provider.

Each run goes through everything a user's run does: the swarm file, the in-process control plane on a Unix
socket, one ``local`` machine per worker slot with the in-sandbox relay, the built-in agent, the broker, the
lead, the report and the audit log. The scripted provider answers every worker with a board post, then a
finding that cites it; the lead answers with a synthesis. Afterwards nothing of the run's machines may be
left: no process and no mount that names the run folder, no machine folder on disk.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rigs.outcomes import assert_simulated_lead_ended
from swarmyard.broker.providers.scripted import CallTools, ScriptedProvider
from swarmyard.domain import CitationKind, Event, ReservationState, TaskState
from swarmyard.report.data import WorkerSpan
from swarmyard.store import open_store
from swarmyard.swarm.coordinator import RunResult
from swarmyard.swarm.run import Swarm

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

WORKER_MODEL = "scripted-worker"
LEAD_MODEL = "scripted-lead"
CLI = "from swarmyard.cli.main import main; main()"
LENSES = ("market size", "strongest open models", "risks")


def swarm_file(tmp_path: Path, policy: str, *, workers: int = 3, extra_policy: str = "", concurrency: int = 1,
               exec_timeout_s: int = 60, lease_s: int = 120, lenses: tuple[str, ...] = LENSES) -> Path:
    """A swarm file on the scripted provider whose runs folder is under ``tmp_path``."""
    lens_tables = "".join(f'[[tasks.lenses]]\ntitle = "{t}"\nprompt = "Look at {t}."\n' for t in lenses)
    text = f"""
[goal]
objective = "Should a small team bet on on-device speech models?"
budget_usd = "1"
call_cap = 200
deadline_s = 600
{lens_tables}
[policy]
kind = "{policy}"
{extra_policy}
[workers]
count = {workers}
concurrency = {concurrency}
exec_timeout_s = {exec_timeout_s}
lease_s = {lease_s}
max_steps = 6
model = "{WORKER_MODEL}"
[lead]
model = "{LEAD_MODEL}"
[providers.script]
kind = "scripted"
models = ["{WORKER_MODEL}", "{LEAD_MODEL}"]
[run]
runs_dir = "{tmp_path / 'runs'}"
sandbox = "local"
"""
    path = tmp_path / "swarm.toml"
    path.write_text(text)
    return path


def worker_replies(tasks: int) -> list[CallTools]:
    """Per task a board post, then a finding citing posts by seq (the agent keeps only those it saw).

    The swarm file runs one agent at a time (``concurrency = 1``) so that the shared script is consumed in
    order: one queue cannot tell concurrent agents apart.
    """
    cite = [str(seq) for seq in range(1, 4 * tasks + 1)]
    replies: list[CallTools] = []
    for i in range(tasks):
        replies.append(CallTools((("board_post", {"body": f"progress note {i}"}),)))
        replies.append(CallTools((("submit_finding", {"title": f"finding {i}", "body": f"what worker {i} found",
                                                      "cite": cite}),)))
    return replies


def scripted(tasks: int) -> ScriptedProvider:
    """Replies for ``tasks`` worker tasks and one lead."""
    synthesis = CallTools((("submit_finding", {"title": "synthesis", "body": "Go: the scouts agree."}),))
    return ScriptedProvider({WORKER_MODEL: worker_replies(tasks), LEAD_MODEL: [synthesis]}, name="script")


def leftovers(run_dir: Path, machine_ids: list[str]) -> list[str]:
    """Anything of the run's machines still alive: processes or mounts naming the run folder, machine disks."""
    mark = str(run_dir.resolve())
    found: list[str] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # the process ended while we looked
        if mark in cmdline:
            found.append(f"process {proc.name}: {cmdline[:200]}")
    found += [f"mount {line}" for line in Path("/proc/self/mountinfo").read_text().splitlines() if mark in line]
    from swarmyard.machines.supervised import default_root

    found += [f"machine disk {m}" for m in machine_ids if (default_root() / "m" / m).exists()]
    return found


def events_of(run_dir: Path, kind: str) -> list[Event]:
    """The run's audit events of one kind."""
    store = open_store(f"sqlite:///{run_dir / 'store.db'}")
    try:
        return [e for e in store.read_events(0, store.sequence_events()) if e.kind == kind]
    finally:
        store.close()


def machine_ids(result: RunResult, run_dir: Path) -> list[str]:
    """The machines the run recorded as created (audit events)."""
    import json

    bodies = [json.loads(e.body) for e in events_of(run_dir, "machine.created")]
    return [str(body.get("data", body)["machine"]) for body in bodies]


def check_run(result: RunResult, run_dir: Path, *, tasks: int) -> None:
    """Every task claimed and done once, findings cited, a synthesis citing them, no machine left, audit OK."""
    data = result.data
    work = [t for t in data.tasks if t.group != "lead"]
    assert len(work) == tasks
    assert all(t.state is TaskState.DONE for t in data.tasks), [(t.title, t.state) for t in data.tasks]
    per_task = Counter(f.task_id for f in data.findings)
    assert set(per_task) == {t.id for t in data.tasks} and max(per_task.values()) == 1
    # claimed once: no task needed a second attempt on a clean run
    assert all(t.attempts == 1 for t in data.tasks), [(t.title, t.attempts) for t in data.tasks]
    workers = [f for f in data.findings if f.group != "lead"]
    assert all(f.citations and {c.kind for c in f.citations} == {CitationKind.POST} for f in workers)
    assert result.synthesis is not None and result.synthesis.body == "Go: the scouts agree."
    assert {c.ref for c in result.synthesis.citations} == {f.id for f in workers}
    assert result.report is not None and "Go: the scouts agree." in result.report.markdown.read_text()
    assert leftovers(run_dir, machine_ids(result, run_dir)) == []
    # each agent run's own output is kept, named by slot and worker, with how it ended
    logs = {p.name: p.read_text() for p in (run_dir / "agents").glob("*.log")}
    assert set(logs) == {f"{s.row}-{s.worker_id}.log" for s in result.spans}
    for span in result.spans:
        text = logs[f"{span.row}-{span.worker_id}.log"]
        assert "exit 0" in text and f'"ending": "{span.ending}"' in text, text
    # every model call's hold was settled before the report read the ledger (none left held)
    assert data.reservations and all(r.state is ReservationState.SETTLED for r in data.reservations)
    verify = subprocess.run(
        [sys.executable, "-c", CLI, "audit", "verify", str(run_dir), "--log-key", str(data.audit_key)],
        capture_output=True, text=True, timeout=60,
    )
    assert verify.returncode == 0 and verify.stdout.startswith("OK "), verify.stdout + verify.stderr
    assert data.audit_root is not None and data.audit_root in verify.stdout


@pytest.mark.parametrize(("policy", "extra", "workers", "tasks"), [
    ("independent", "", 3, 3),
    ("team", "", 3, 3),
    ("explore", "", 3, 3),
    ("groups", "groups = 2\nrounds = 2", 2, 3 * 2 * 2),
])
def test_each_policy_runs_to_a_synthesis_in_real_sandboxes(
    short_tmp: Path, policy: str, extra: str, workers: int, tasks: int
) -> None:
    provider = scripted(tasks)
    result = Swarm.from_file(swarm_file(short_tmp, policy, workers=workers, extra_policy=extra),
                             providers={"script": provider}).run()
    run_dir = short_tmp / "runs" / result.run_id
    check_run(result, run_dir, tasks=tasks)
    groups = {t.group for t in result.data.tasks} - {"lead"}
    expected = {"independent": {"w0", "w1", "w2"}, "team": {"team"}, "explore": {"explore"},
                "groups": {"g0", "g1"}}[policy]
    assert groups == expected
    # every model call went through the broker with a worker's token: the ledger names a worker per call
    assert len(provider.requests) == 2 * tasks + 1



def stuck_then_done(marker: str) -> ScriptedProvider:
    """The first agent runs a shell command that never ends (``marker`` names it); the next posts and submits."""
    stuck = CallTools((("shell", {"command": f"sleep 600 # {marker}"}),))
    synthesis = CallTools((("submit_finding", {"title": "synthesis", "body": "Go: the scouts agree."}),))
    return ScriptedProvider({WORKER_MODEL: [stuck, *worker_replies(1)], LEAD_MODEL: [synthesis]}, name="script")


def check_taken_over(result: RunResult, run_dir: Path, stuck: WorkerSpan) -> None:
    """The stuck worker's task was completed once, by another worker; the run finished clean."""
    (task,) = [t for t in result.data.tasks if t.group != "lead"]
    # (a killed agent prints no outcome, so its span cannot name the task it held: stuck.task_id is None)
    assert task.state is TaskState.DONE and task.attempts == 2 and task.worker_id != stuck.worker_id
    findings = [f for f in result.data.findings if f.task_id == task.id]
    assert len(findings) == 1 and findings[0].author != stuck.worker_id
    assert result.synthesis is not None and len(result.synthesis.citations) == 1
    assert leftovers(run_dir, machine_ids(result, run_dir)) == []


def test_a_hung_worker_times_out_and_another_completes_its_task(short_tmp: Path) -> None:
    # one lens, two workers at once, a 2 s lease: the stuck worker's task goes to the other one
    path = swarm_file(short_tmp, "team", workers=2, concurrency=2, exec_timeout_s=5, lease_s=2,
                      lenses=("market size",))
    result = Swarm.from_file(path, providers={"script": stuck_then_done("hang")}).run()
    (hung,) = [s for s in result.spans if s.ending == "timeout"]
    check_taken_over(result, short_tmp / "runs" / result.run_id, hung)


def kill_agent_running(marker: str, stop: threading.Event) -> list[int]:
    """Wait for the shell command naming ``marker``, then SIGKILL the agent that started it (its parent).

    Runs in a thread beside the run; it waits on the process table, not on time. Returns the killed pids.
    """
    killed: list[int] = []
    while not stop.is_set() and not killed:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes()
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if marker.encode() in cmdline and b"/bin/sh" in cmdline:
                os.kill(ppid, signal.SIGKILL)
                killed.append(ppid)
                break
        stop.wait(0.05)
    return killed


@pytest.mark.parametrize("lease_s", [2, 600])
def test_a_worker_killed_mid_run_loses_its_task_to_another(short_tmp: Path, lease_s: int) -> None:
    # with a 600 s lease, the task can only move on because the runner gives back the claim of an agent that
    # exited holding it (the run's deadline is shorter than that lease)
    marker = f"kill-me-{short_tmp.name}"
    path = swarm_file(short_tmp, "team", workers=2, concurrency=2, exec_timeout_s=60, lease_s=lease_s,
                      lenses=("market size",))
    stop = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        killer = pool.submit(kill_agent_running, marker, stop)
        try:
            result = Swarm.from_file(path, providers={"script": stuck_then_done(marker)}).run()
        finally:
            stop.set()
        assert len(killer.result()) == 1
    (killed,) = [s for s in result.spans if s.ending == "error"]
    check_taken_over(result, short_tmp / "runs" / result.run_id, killed)
    if lease_s == 600:  # (with 2 s, the lease may run out before the runner sees the agent gone)
        assert len(events_of(short_tmp / "runs" / result.run_id, "task.released")) == 1


def cli_swarm_file(folder: Path, lenses: int) -> Path:
    """A swarm file the CLI can run on its own: the simulated provider (it answers text the agent turns into
    partial findings), one agent at a time, so a kill lands between findings."""
    path = swarm_file(folder, "team", workers=2, lenses=tuple(f"lens {i}" for i in range(lenses)))
    text = path.read_text().replace('kind = "scripted"', 'kind = "simulated"').replace("max_steps = 6",
                                                                                       "max_steps = 1")
    path.write_text(text)
    return path


def findings_in(db: Path) -> list[tuple[str, str]]:
    """(finding id, task id) straight from the run's SQLite file, read-only, while the runner writes."""
    if not db.exists():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as conn:
        try:
            return [(str(a), str(b)) for a, b in conn.execute("SELECT id, task_id FROM findings")]
        except sqlite3.OperationalError:
            return []  # the schema is not there yet


def test_a_runner_killed_mid_run_resumes_without_loss_or_duplicates(short_tmp: Path) -> None:
    path = cli_swarm_file(short_tmp, lenses=5)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8"}
    runner = subprocess.Popen([sys.executable, "-c", CLI, "run", str(path), "--quiet"], cwd=short_tmp, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        # wait, on the store itself, for the first finding; then kill the runner with no chance to clean up
        before: list[tuple[str, str]] = []
        while not before and runner.poll() is None:
            dbs = list((short_tmp / "runs").glob("*/store.db"))
            before = findings_in(dbs[0]) if dbs else []
            with contextlib.suppress(subprocess.TimeoutExpired):
                runner.wait(timeout=0.02)  # a pause between looks, and an early exit if the run ends
        assert runner.poll() is None, "the run ended before it could be killed"
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=30)
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait()
    (run_dir,) = (short_tmp / "runs").iterdir()
    before = findings_in(run_dir / "store.db")
    assert before and len(before) < 5 + 1
    resumed = subprocess.run([sys.executable, "-c", CLI, "run", str(path), "--resume", run_dir.name], cwd=short_tmp,
                             env=env, capture_output=True, text=True, timeout=120)
    assert_simulated_lead_ended(resumed.returncode, resumed.stderr)
    after = findings_in(run_dir / "store.db")
    assert set(before) <= set(after)  # nothing lost
    per_task = Counter(task for _, task in after)
    assert len(per_task) == 5 + 1 and max(per_task.values()) == 1  # every task once, the lead's included
    store = open_store(f"sqlite:///{run_dir / 'store.db'}")
    try:
        (goal,) = store.list_goals()
        assert all(t.state is TaskState.DONE for t in store.list_tasks(goal.id))
    finally:
        store.close()
    assert leftovers(run_dir, []) == []
