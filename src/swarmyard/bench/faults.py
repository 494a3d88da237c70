"""``swarmyard bench faults``: faults injected into small real runs; per case, whether the run survived and how
long it took from the fault to the run's next progress.

Each case is ``swarmyard run`` in a subprocess on the scripted provider, in real ``local`` machines, with a temp
folder (and so a machines root) of its own:

- ``worker_kill``: the agent is killed with SIGKILL while it runs a command; another agent completes the task;
- ``runner_kill``: ``swarmyard run`` is killed with SIGKILL once it has written a finding; ``--resume`` ends it;
- ``upstream_drop``: the provider loses a worker's call after it was sent; the hold ends ``unknown``, the call
  is not sent again, and the run goes on to its synthesis.

A case survived when the run (or its resume) exits 0 with every task done exactly once, no hold left ``held``,
no machine folder or machine process left in its machines root, and ``swarmyard audit verify`` accepting the
log and the tables (which checks every envelope against the events). Recovery is from the fault (the kill, or
the lost call's ``reservation.unknown`` event) to the next finding written after it. The end-to-end suite
(``pytest -m faults``) asserts more per case (stale fencing tokens refused, envelopes summed hold by hold), and
covers a PostgreSQL restart, which needs a server this benchmark does not start.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from swarmyard.bench.children import child_env
from swarmyard.bench.result import BenchResult, BenchRow

T = TypeVar("T")
#: How long any one run of a case may take before the case counts as not survived.
RUN_TIMEOUT_S = 600.0
SYNTHESIS = "The findings agree."


@dataclass(frozen=True, slots=True)
class CaseResult:
    """One fault case: whether the run survived it, the seconds from the fault to the next finding, why not."""

    name: str
    survived: bool
    recovery_s: float | None
    why: str = ""


def _tool(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def _finding(n: int) -> dict[str, Any]:
    return _tool("submit_finding", title=f"finding {n}", body=f"What lens {n} shows, in brief.")


class _Run:
    """One case's folder: its swarm file, its runs, its own temp folder (machines root) and its runners."""

    def __init__(self, folder: Path, worker: list[dict[str, Any]], lenses: int, max_failures: int) -> None:
        self.folder = folder
        self.tmp = folder / "tmp"
        self.tmp.mkdir()
        self.machines = self.tmp / f"swarmyard-machines-{os.getuid()}"
        replies = {"scripted-worker": worker,
                   "scripted-lead": [_tool("submit_finding", title="synthesis", body=SYNTHESIS)]}
        (folder / "replies.json").write_text(json.dumps(replies))
        tasks = "".join(f'[[tasks.lenses]]\ntitle = "lens {i}"\nprompt = "Look at lens {i}."\n'
                        for i in range(lenses))
        prices = 'input_usd_per_mtok = "3"\noutput_usd_per_mtok = "15"\n'
        self.swarm = folder / "swarm.toml"
        self.swarm.write_text(
            f'[goal]\nobjective = "Should a small team build a speech app?"\nbudget_usd = "1"\ncall_cap = 200\n'
            f"deadline_s = 600\n{tasks}[workers]\ncount = {lenses}\nconcurrency = {min(2, lenses)}\n"
            f'exec_timeout_s = 120\nmax_steps = 4\nmax_failures = {max_failures}\nmodel = "scripted-worker"\n'
            'retry_backoff_s = 0.2\n[lead]\nmodel = "scripted-lead"\n[providers.script]\nkind = "scripted"\n'
            'models = ["scripted-worker", "scripted-lead"]\nreplies = "replies.json"\n'
            f"[providers.script.prices.scripted-worker]\n{prices}[providers.script.prices.scripted-lead]\n{prices}"
            f'[run]\nruns_dir = "{folder / "runs"}"\nsandbox = "local"\n')
        self.env = {**child_env(), "HOME": str(folder), "TMPDIR": str(self.tmp)}
        self.env.setdefault("LANG", "C.UTF-8")
        self.runners: list[subprocess.Popen[bytes]] = []

    def start(self, *more: str) -> subprocess.Popen[bytes]:
        n = len(self.runners)
        with (self.folder / f"runner-{n}.err").open("wb") as err:
            runner = subprocess.Popen([sys.executable, "-m", "swarmyard.cli", "run", str(self.swarm), *more],
                                      cwd=self.folder, env=self.env, stdout=subprocess.DEVNULL, stderr=err)
        self.runners.append(runner)
        return runner

    def error_tail(self) -> str:
        n = len(self.runners) - 1
        return (self.folder / f"runner-{n}.err").read_text(errors="replace")[-300:].strip().replace("\n", " | ")

    @property
    def run_dir(self) -> Path | None:
        runs = self.folder / "runs"
        found = [p for p in runs.iterdir() if (p / "store.db").exists()] if runs.is_dir() else []
        return found[0] if found else None

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        run_dir = self.run_dir
        if run_dir is None:
            return []
        try:
            with sqlite3.connect(f"file:{run_dir / 'store.db'}?mode=ro", uri=True, timeout=5) as db:
                return db.execute(sql, params).fetchall()
        except sqlite3.Error:
            return []  # not made yet, or busy: the next poll reads it

    def until(self, runner: subprocess.Popen[bytes], probe: Callable[[], T | None], what: str) -> T:
        """Poll ``probe`` while the runner runs (its own deadline bounds it); the runner ending first fails."""
        pause = threading.Event()
        started = time.monotonic()
        while True:
            got = probe()
            if got is not None:
                return got
            if runner.poll() is not None or time.monotonic() - started > RUN_TIMEOUT_S:
                raise _NotSurvived(f"the run ended before {what}: {self.error_tail()}")
            pause.wait(0.05)

    def finish(self, runner: subprocess.Popen[bytes]) -> int:
        try:
            return runner.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            runner.kill()
            runner.wait()
            raise _NotSurvived(f"the run did not end within {RUN_TIMEOUT_S:g} s") from None

    def next_finding_after(self, at: float) -> float | None:
        rows = self.rows("SELECT min(created_at) FROM events WHERE kind = 'finding.submitted' AND created_at > ?",
                         (at,))
        return float(rows[0][0]) - at if rows and rows[0][0] is not None else None

    def survived(self, failed: int) -> str:
        """Why the finished run does not count as survived ('' when it does); ``failed`` tasks may have failed
        (the one whose only try lost its call), every other one must be done."""
        run_dir = self.run_dir
        if run_dir is None:
            return "no run folder"
        states = {str(s): int(n) for s, n in self.rows("SELECT state, count(*) FROM tasks GROUP BY state")}
        if not states.get("done") or {k: v for k, v in states.items() if k != "done"} != (
                {"failed": failed} if failed else {}):
            return f"tasks ended {states}, not all done but {failed} failed"
        completions = self.rows("SELECT count(*) FROM events WHERE kind = 'task.completed'")
        if not completions or completions[0][0] != states["done"]:
            return f"{completions[0][0] if completions else 0} completions for {states['done']} done tasks"
        held = self.rows("SELECT count(*) FROM reservations WHERE state = 'held'")
        if not held or held[0][0]:
            return f"{held[0][0] if held else '?'} holds left held"
        left = sorted(p.name for p in (self.machines / "m").iterdir()) if (self.machines / "m").is_dir() else []
        if left:
            return f"machine folders left: {left}"
        running = _machine_pids(self.machines)
        if running:
            return f"machine processes left: {running}"
        verify = subprocess.run([sys.executable, "-m", "swarmyard.cli", "audit", "verify", str(run_dir)],
                                cwd=self.folder, env=self.env, capture_output=True, text=True, timeout=600)
        if verify.returncode != 0 or "tables match" not in verify.stdout:
            return f"audit verify: {(verify.stdout + verify.stderr).strip()[:300]}"
        return ""

    def close(self) -> None:
        """Stop what still runs, and reap the machines a killed runner left (their cgroups outlive the folder)."""
        for runner in self.runners:
            if runner.poll() is None:
                runner.kill()
                runner.wait()
        if (self.machines / "m").is_dir() and any((self.machines / "m").iterdir()):
            from swarmyard.machines.local import LocalBackend

            LocalBackend(self.machines, parked=0)  # it reaps its root's machines whose owner died, as it starts


class _NotSurvived(Exception):
    """The run did not get through its fault (the message says where it stopped)."""


def _machine_pids(root: Path, name: str | None = None) -> list[int]:
    """Live processes that mount a machine folder under ``root`` (of machine ``name``, when given)."""
    marker = f"{root}/m/{name + '/' if name else ''}"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "mountinfo").read_text() and \
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                found.append(int(entry.name))
        except (OSError, IndexError):
            continue  # gone meanwhile
    return sorted(found)


def _blocked_agent(root: Path) -> int | None:
    """The pid of an agent (it holds a worker token) whose machine runs ``cat`` (the command it waits in)."""
    pids = _machine_pids(root)
    waiting, agents = False, []
    for pid in pids:
        try:
            waiting = waiting or Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"cat\0")
            if b"SWARMYARD_TOKEN=" in Path(f"/proc/{pid}/environ").read_bytes():
                agents.append(pid)
        except OSError:
            continue
    return agents[0] if waiting and agents else None


def _worker_kill(run: _Run) -> float | None:
    runner = run.start()
    pid = run.until(runner, lambda: _blocked_agent(run.machines), "the agent blocked in its command")
    fault = time.time()
    os.kill(pid, signal.SIGKILL)
    if run.finish(runner) != 0:
        raise _NotSurvived(f"exit {runner.returncode}: {run.error_tail()}")
    return run.next_finding_after(fault)


def _runner_kill(run: _Run) -> float | None:
    runner = run.start()
    run.until(runner, lambda: True if run.rows("SELECT id FROM findings") else None, "a finding was written")
    fault = time.time()
    os.kill(runner.pid, signal.SIGKILL)
    runner.wait()
    run_dir = run.run_dir
    assert run_dir is not None
    resumed = run.start("--resume", run_dir.name)
    if run.finish(resumed) != 0:
        raise _NotSurvived(f"the resume exited {resumed.returncode}: {run.error_tail()}")
    return run.next_finding_after(fault)


def _upstream_drop(run: _Run) -> float | None:
    runner = run.start()
    if run.finish(runner) != 0:
        raise _NotSurvived(f"exit {runner.returncode}: {run.error_tail()}")
    worker = [str(s) for (s,) in run.rows("SELECT state FROM reservations WHERE model = 'scripted-worker'")]
    if worker != ["unknown"]:
        raise _NotSurvived(f"the worker's holds ended {worker}, not one unknown (a lost call sent again?)")
    lost = run.rows("SELECT created_at FROM events WHERE kind = 'reservation.unknown'")
    return run.next_finding_after(float(lost[0][0])) if lost else None


#: name -> (the worker model's replies, lenses, workers.max_failures, what injects the fault and returns the
#: recovery time). A lost call's agent stops at its error; with one failure allowed its task fails (any second
#: worker hold would then be a call sent again) and the run goes on to its synthesis.
CASES: dict[str, tuple[list[dict[str, Any]], int, int, Callable[[_Run], float | None]]] = {
    "worker_kill": ([_tool("shell", command="mkfifo /tmp/wait && cat /tmp/wait"), _finding(0)], 1, 3,
                    _worker_kill),
    "runner_kill": ([_finding(0)] * 8, 4, 3, _runner_kill),
    "upstream_drop": ([{"fail": "after_send"}, _finding(0)], 1, 1, _upstream_drop),
}
#: how many tasks a case's run ends with failed, by design
FAILED = {"upstream_drop": 1}


def run_case(name: str) -> CaseResult:
    """Run one fault case in a temp folder of its own (removed after)."""
    worker, lenses, max_failures, inject = CASES[name]
    folder = Path(tempfile.mkdtemp(prefix="sy-bf-"))  # the plane's socket lives in the run folder: keep it short
    run = _Run(folder, worker, lenses, max_failures)
    try:
        try:
            recovery = inject(run)
        except _NotSurvived as exc:
            return CaseResult(name, False, None, str(exc))
        why = run.survived(FAILED.get(name, 0))
        if not why and recovery is None:
            why = "no finding was written after the fault"
        return CaseResult(name, not why, recovery, why)
    finally:
        run.close()
        shutil.rmtree(folder, ignore_errors=True)


def run(quick: bool = False, **options: object) -> BenchResult:
    """Every fault case once (``quick`` changes nothing: each case is already one small run)."""
    result = BenchResult(area="faults")
    cases = [run_case(name) for name in CASES]
    for case in cases:
        result.add(BenchRow(f"{case.name}: survived", 1.0 if case.survived else 0.0, "yes=1", target="1"))
        if case.recovery_s is not None:
            result.add(BenchRow(f"{case.name}: fault to next finding", case.recovery_s, "s"))
        if case.why:
            result.notes.append(f"{case.name}: {case.why}")
    result.summary = {
        "cases": {c.name: {"survived": c.survived, "recovery_s": None if c.recovery_s is None
                           else round(c.recovery_s, 3), **({"why": c.why} if c.why else {})} for c in cases},
        "survived": sum(c.survived for c in cases),
        "of": len(cases),
    }
    result.notes.append("each case is swarmyard run on the scripted provider in real local machines; recovery is "
                        "from the fault to the next finding written (a runner kill's includes the resume's start)")
    return result
