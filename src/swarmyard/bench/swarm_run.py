"""``swarmyard bench swarm --upstream-latency S --compare 10,200``: real ``swarmyard run`` processes, side by side.

Each size N is one ``swarmyard run`` in a fresh process (``python -m swarmyard.cli run FILE --quiet``) of N
workers, all N at once (concurrency N), in real ``local`` machines with the built-in agent in each, on one
simulated upstream that answers every call after S seconds (the broker's ``simulated`` provider). The workers'
model answers words that are no action, so each worker's time is its step cap's calls; the lead's model (the same
provider in its ``attempts`` behaviour, same latency) answers a finding on its first call, so every run ends with a
synthesis and exits 0, the lead's part being one call of S seconds at every size. The figures come
from the run's own store: its wall time is from its first event to ``run.closed`` (the last machine deleted), and
the process's tail is how long after ``run.closed`` it exited (the bench's monotonic clock around the subprocess,
put on the wall clock the store's events use). The ratio compared is the largest run's wall time over the
smallest's: with every worker in parallel and nothing else costing anything, it would be 1.

Where each run's time went is read from the same store, per worker: its machine made (``machine.created``, from
the run's start), its first model call held by the broker, and its agent run's end. Beside it, how busy the host's
cores were while the process ran (``/proc/stat``: every process and the kernel, this run's or not), and the CPU of
the run's own process tree (its plane, its machines' sandboxes and the agents in them: ``getrusage`` of the children
it reaped). Near 1, the larger run's extra time is the cores' work (machines booted and agents started, each a
Python interpreter) and not a wait on a serial step; the run's own share says how much of that work was its own.
"""

from __future__ import annotations

import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from swarmyard.bench.result import BenchResult, BenchRow
from swarmyard.bench.swarm_sandboxed import host_cpu

#: steps each worker takes (the simulated answer is no action, so a step is the call and its re-asks)
STEPS = 2


@dataclass(frozen=True, slots=True)
class RunTimes:
    """One ``swarmyard run`` of ``workers`` workers: seconds from its first event."""

    workers: int
    exit_code: int
    wall_s: float  # first event to run.closed
    tail_s: float  # run.closed to the process's exit
    machines_made_s: float  # the last worker's machine created
    first_calls_s: tuple[float, ...]  # each worker's first held call
    workers_done_s: float  # the last worker's agent run ended (the lead starts after it)
    machines: int
    host_cpu_s: float = 0.0  # the host's busy CPU seconds while the process ran (all cores, everyone's)
    host_busy: float = 0.0  # that over the process's time times the cores (1: every core busy throughout)
    run_cpu_s: float = 0.0  # the CPU of the run's process tree (plane, sandboxes, agents), reaped at its exit
    run_s: float = 0.0  # the process's own time, start to exit
    said: str = ""  # the last line the process wrote on stderr (why it failed, when it did)


def _swarm_file(folder: Path, workers: int, latency_s: float) -> Path:
    lenses = "".join(f'[[tasks.lenses]]\ntitle = "lens {i}"\nprompt = "Say one fact about {i}."\n'
                     for i in range(workers))
    path = folder / "swarm.toml"
    path.write_text(f"""
[goal]
objective = "Count things"
budget_usd = "100"
call_cap = {workers * (3 * STEPS + 2) + 50}
deadline_s = 1800
{lenses}
[workers]
count = {workers}
concurrency = {workers}
max_steps = {STEPS}
model = "sim-1"
[lead]
model = "sim-lead"
[providers.sim]
kind = "simulated"
models = ["sim-1"]
latency_s = {latency_s}
[providers.sim.prices.sim-1]
input_usd_per_mtok = "1"
output_usd_per_mtok = "2"
[providers.simlead]
kind = "simulated"
simulate = "attempts"
models = ["sim-lead"]
latency_s = {latency_s}
[providers.simlead.prices.sim-lead]
input_usd_per_mtok = "1"
output_usd_per_mtok = "2"
[run]
runs_dir = "{folder / 'runs'}"
sandbox = "local"
""", encoding="utf-8")
    return path


def measure(workers: int, latency_s: float) -> RunTimes:
    """Run one ``swarmyard run`` of ``workers`` workers at once and read its times from its store."""
    folder = Path(tempfile.mkdtemp(prefix="sy-bench-run-", dir="/tmp"))  # the plane's socket: keep it short
    try:
        (folder / "tmp").mkdir()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8",
               "TMPDIR": str(folder / "tmp")}
        if "PYTHONPATH" in os.environ:
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        wall, began = time.time(), time.monotonic()
        cpu_before, tree_before = host_cpu(), _children_cpu_s()
        done = subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(_swarm_file(folder, workers,
                                                                                             latency_s)),
                               "--quiet"], cwd=folder, env=env, capture_output=True, text=True, timeout=3600,
                              check=False)
        exited = wall + (time.monotonic() - began)
        busy, total = (after - before for after, before in zip(host_cpu(), cpu_before, strict=True))
        tree = _children_cpu_s() - tree_before
        runs = list((folder / "runs").iterdir()) if (folder / "runs").is_dir() else []
        if len(runs) != 1:
            raise RuntimeError(f"swarmyard run exit {done.returncode} left no run folder: {done.stderr[-2000:]}")
        with sqlite3.connect(f"file:{runs[0] / 'store.db'}?mode=ro", uri=True) as db:
            first = db.execute("SELECT min(created_at) FROM events").fetchone()[0]
            closed = db.execute("SELECT max(created_at) FROM events WHERE kind = 'run.closed'").fetchone()[0]
            made = [t for (t,) in db.execute("SELECT created_at FROM events WHERE kind = 'machine.created'")]
            holds = db.execute("SELECT task_id, min(created_at) FROM reservations GROUP BY task_id").fetchall()
        if closed is None:
            raise RuntimeError(f"swarmyard run exit {done.returncode} has no run.closed: {done.stderr[-2000:]}")
        # the lead's machine is the last one made and its call the last one held: the workers' are the first N
        made.sort()
        calls = sorted(t for _, t in holds)[:workers]
        worker_made = made[:workers]
        ended = _workers_ended(runs[0], workers)
        return RunTimes(workers, done.returncode, closed - first, exited - closed,
                        (worker_made[-1] - first) if worker_made else 0.0,
                        tuple(t - first for t in calls), (ended - first) if ended else 0.0, len(made), busy,
                        busy / max(1e-9, total), tree, exited - wall,
                        (done.stderr.strip().splitlines() or [""])[-1][:300])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _children_cpu_s() -> float:
    """User and system CPU of every child this process reaped (and of what each of them reaped in turn)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _workers_ended(run_dir: Path, workers: int) -> float | None:
    """When the last worker's agent run ended: the N-th earliest agent log written (the lead's is the last)."""
    logs = sorted(p.stat().st_mtime for p in (run_dir / "agents").glob("*.log"))
    return logs[min(workers, len(logs)) - 1] if logs else None


def _median(values: tuple[float, ...]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


def run(sizes: list[int], latency_s: float) -> BenchResult:
    """Measure each size (smallest first) and compare the largest's wall time with the smallest's."""
    result = BenchResult(area="swarm")
    cores = len(os.sched_getaffinity(0))
    got: dict[int, RunTimes] = {}
    for n in sorted(set(sizes)):
        times = got[n] = measure(n, latency_s)
        label = f"swarmyard run, {n} workers at once on a {latency_s:g} s upstream"
        result.add(BenchRow(f"{label}: wall (first event to run.closed)", times.wall_s, "s"))
        result.add(BenchRow(f"{label}: last worker machine made", times.machines_made_s, "s"))
        result.add(BenchRow(f"{label}: first model call (median)", _median(times.first_calls_s), "s"))
        result.add(BenchRow(f"{label}: the last worker's first model call", max(times.first_calls_s, default=0.0),
                            "s"))
        result.add(BenchRow(f"{label}: last worker's agent ended", times.workers_done_s, "s"))
        result.add(BenchRow(f"{label}: process exit after run.closed", times.tail_s, "s", target="<= 5"))
        result.add(BenchRow(f"{label}: host cores busy while it ran (all processes, kernel)", times.host_busy,
                            "share"))
        result.add(BenchRow(f"{label}: host CPU while it ran, per worker (all processes, kernel)",
                            times.host_cpu_s / n, "s"))
        result.add(BenchRow(f"{label}: the run's own CPU (plane, sandboxes, agents), per worker",
                            times.run_cpu_s / n, "s"))
        result.add(BenchRow(f"{label}: the run's own CPU over its time on every core", times.run_cpu_s
                            / max(1e-9, times.run_s * cores), "share"))
        result.summary[f"run_wall_s_{n}"] = round(times.wall_s, 3)
        result.summary[f"run_tail_s_{n}"] = round(times.tail_s, 3)
        result.summary[f"run_last_first_call_s_{n}"] = round(max(times.first_calls_s, default=0.0), 3)
        result.summary[f"run_exit_code_{n}"] = times.exit_code
        result.summary[f"run_host_busy_{n}"] = round(times.host_busy, 3)
        result.summary[f"run_host_cpu_s_per_worker_{n}"] = round(times.host_cpu_s / n, 3)
        result.summary[f"run_own_cpu_s_per_worker_{n}"] = round(times.run_cpu_s / n, 3)
        result.summary[f"run_own_cpu_share_{n}"] = round(times.run_cpu_s / max(1e-9, times.run_s * cores), 3)
        if times.exit_code:
            result.notes.append(f"{n} workers: swarmyard run exit {times.exit_code}: {times.said}")
        if times.machines < n + 1:
            result.notes.append(f"{n} workers: {times.machines} machines made (expected {n} and the lead's)")
    small, large = min(got), max(got)
    if small != large:
        ratio = got[large].wall_s / got[small].wall_s
        result.add(BenchRow(f"swarmyard run: {large} workers' wall over {small} workers'", got[large].wall_s, "s",
                            got[small].wall_s, f"{small} workers' wall", "<= 1.2"))
        result.summary["run_compare_ratio"] = round(ratio, 3)
    result.summary.update(upstream_latency_s=latency_s, compared=sorted(got))
    result.notes.append(
        f"each size is one swarmyard run in a fresh process, every worker at once in a local machine with the "
        f"built-in agent, {STEPS} steps each, then the lead (one call: its model answers a synthesis); the "
        f"upstream is the simulated provider answering after {latency_s:g} s. Times come from the run's store "
        "(first event, machine.created, the broker's holds, run.closed) and the process's exit")
    return result
