"""``swarmyard bench swarm --sandboxed --workers N``: N real machines, the real built-in agent in each.

Each worker is what a run's worker is: a ``local`` machine (bubblewrap, its own disk, cgroups) created and deleted
through the Machines API, running ``python -m swarmyard.agents`` against the control plane and broker through the
machine's in-sandbox relay; the model is the simulated provider with a fixed latency. Every worker starts at
once, takes a task, makes its model calls (the simulated answer is no action, so each step asks three times:
the call and two re-asks), reports its steps and submits a partial finding. The ideal wall time is the calls
of one agent times the latency (every agent in parallel, nothing else costing anything); ``overhead_ratio`` is
``wall / ideal``, as for the in-process workers of :mod:`swarmyard.bench.swarm`.

What else it reports, to say where it saturates:

- each agent's own CPU and peak RSS (``getrusage`` in the agent's process at its exit), and the control
  plane's CPU per request;
- memory per machine: how far the host's ``MemAvailable`` fell while the most agents were alive, divided by
  them (the agent, the sandbox's init and relay, its disk, the kernel's share);
- the ramp: how long after the start the last agent was up, and the CPU all of this took over the wall time;
- how busy the host's cores were (``/proc/stat``: every process and the kernel, this benchmark's or not) from
  the start until the last agent's first model call: near 1, the ramp is the cores' work and nothing waits on a
  serial step; well under 1, something serial holds the agents back.

On one host the agents' start-up is CPU (imports, mostly): N agents need N times one agent's CPU before the
last one makes its first call, so ``wall - ideal`` grows with N over the cores; memory caps N at
``MemAvailable`` over the memory per machine.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from swarmyard.bench.result import BenchResult, BenchRow
from swarmyard.bench.swarm_plane import MODEL, serve_plane, tree_cpu_s, wait_ready
from swarmyard.domain import GoalSpec, TaskSpec
from swarmyard.machines.environment import lean_python

if TYPE_CHECKING:
    from swarmyard.agents.settings import AgentSettings
    from swarmyard.machines.api import Machines

#: Runs the agent as ``python -m swarmyard.agents`` does, and at its exit writes its own CPU and peak RSS on stderr,
#: with the wall time its interpreter was up (its first statement; the agent's imports come after).
_AGENT = (
    "import time\n"
    "up = time.time()\n"
    "import atexit, resource, runpy, sys\n"
    "def _said():\n"
    "    u = resource.getrusage(resource.RUSAGE_SELF)\n"
    "    sys.stderr.write(f'bench-rusage {u.ru_utime + u.ru_stime:.4f} {u.ru_maxrss} {up:.4f}\\n')\n"
    "atexit.register(_said)\n"
    "runpy.run_module('swarmyard.agents', run_name='__main__', alter_sys=True)\n"
)
#: Set in every agent's environment, so the sampler counts this benchmark's agents and no one else's.
_MARK = "SWARMYARD_BENCH_RUN"


@dataclass(slots=True)
class _Agent:
    """What one worker did: when its machine was asked for and ready, when its agent's interpreter was up (wall
    clock, as the store's), its exit, its CPU and peak RSS (from the agent)."""

    boot_s: float = 0.0
    began_at: float = 0.0
    ready_at: float = 0.0
    up_at: float = 0.0
    exit_code: int | None = None
    cpu_s: float | None = None
    maxrss_kib: int | None = None
    error: str = ""


@dataclass(frozen=True, slots=True)
class Phases:
    """One agent's way to its first model call, in seconds: its machine's boot (create until ready), its start
    (ready until its interpreter runs), then until the broker held its first call (its imports, its claim, the
    board, its prompt); ``first_call_s`` is that moment counted from the start of the whole burst."""

    boot_s: float
    start_s: float
    to_call_s: float
    first_call_s: float


@dataclass(frozen=True, slots=True)
class SandboxedRun:
    """One measured run of ``workers`` sandboxed agents."""

    workers: int
    latency_s: float
    calls_per_agent: int
    wall_s: float
    errors: int
    findings: int
    last_up_s: float  # from the start until the last agent process was running
    most_alive: int  # agent processes alive at once, at most
    mem_available_drop_bytes: int  # how far MemAvailable fell at that moment
    agent_cpu_s: tuple[float, ...]
    agent_maxrss_kib: tuple[int, ...]
    boot_s: tuple[float, ...]  # create until ready, per machine
    server_cpu_s: float
    bench_cpu_s: float  # this process: the Machines API's threads (create, exec, delete)
    requests: int
    failures: tuple[str, ...] = field(default_factory=tuple)
    #: where each agent's time went before its first model call, one :class:`Phases` per agent that made one
    phases: tuple[Phases, ...] = field(default_factory=tuple)
    #: the host's busy CPU seconds (all cores, everyone's processes and the kernel) from the start until the last
    #: agent's first call, and that over the ramp's wall time times the cores (1: every core busy throughout)
    host_cpu_s_ramp: float = 0.0
    host_busy_ramp: float = 0.0

    @property
    def ideal_s(self) -> float:
        """One agent's calls, every agent in parallel, nothing but the model's latency."""
        return self.calls_per_agent * self.latency_s

    @property
    def overhead_ratio(self) -> float:
        """``wall / ideal``."""
        return self.wall_s / self.ideal_s if self.ideal_s else float("inf")

    @property
    def memory_per_machine_bytes(self) -> int:
        """The fall of MemAvailable while the most agents were alive, per agent alive then."""
        return self.mem_available_drop_bytes // max(1, self.most_alive)


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def host_cpu() -> tuple[float, float]:
    """The host's busy and total CPU seconds since boot, summed over its cores (``/proc/stat``: idle and iowait
    are not busy)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - ticks[3] - ticks[4]) / hz, sum(ticks) / hz


def _ours(mark: bytes) -> int:
    """Agent processes alive now whose environment carries ``mark``."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if mark in f.read():
                    count += 1
        except OSError:
            continue  # exited, or not ours to read
    return count


class _Sampler:
    """Every second: our agents alive and MemAvailable; keeps the moment the most were alive."""

    def __init__(self, mark: str) -> None:
        self._mark = f"{_MARK}={mark}".encode()
        self._stop = threading.Event()
        self.baseline = _mem_available()
        self.most_alive = 0
        self.drop_at_most = 0
        self.all_up_at: float | None = None
        self.started = time.perf_counter()
        self.wanted = 0
        #: every second: (seconds since the start, the host's busy and total CPU seconds)
        self.cpu: list[tuple[float, float, float]] = []
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def start(self, wanted: int) -> None:
        self.wanted = wanted
        self.started = time.perf_counter()
        self.cpu.append((0.0, *host_cpu()))
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.cpu.append((time.perf_counter() - self.started, *host_cpu()))
            alive = min(self.wanted, _ours(self._mark))  # (a forked child of an agent carries its mark too)
            if alive >= self.most_alive:
                self.most_alive = alive
                self.drop_at_most = max(0, self.baseline - _mem_available())
            if alive >= self.wanted and self.all_up_at is None:
                self.all_up_at = time.perf_counter() - self.started

    def busy_until(self, at_s: float) -> tuple[float, float]:
        """The host's busy CPU seconds from the start until the last sample at or before ``at_s`` (the first one
        after the start at least), and their share of all the cores' time then."""
        if len(self.cpu) < 2:
            return 0.0, 0.0
        _, busy0, total0 = self.cpu[0]
        _, busy, total = max((c for c in self.cpu[1:] if c[0] <= at_s), default=self.cpu[1])
        return busy - busy0, (busy - busy0) / max(1e-9, total - total0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _worker(machines: Machines, index: int, sock: Path, settings: AgentSettings, env: dict[str, str],
            timeout_s: float, out: _Agent) -> None:
    began = time.perf_counter()
    out.began_at = time.time()
    machine: str | None = None
    try:
        info = machines.create(f"bench-{index}", control_socket=sock)
        machine = info.id
        ready = machines.wait_until_ready(info.id)
        out.boot_s = time.perf_counter() - began
        out.ready_at = time.time()
        python = lean_python()  # as the machine launcher starts the agent
        agent_env = {**python.env, **env,
                     **replace(settings, plane_url=f"http://127.0.0.1:{ready.relay_port}").to_env()}
        result = machines.exec(info.id, [*python.argv, "-c", _AGENT], env=agent_env, timeout=timeout_s)
        out.exit_code = result.exit_code
        for line in result.stderr.decode("utf-8", "replace").splitlines():
            if line.startswith("bench-rusage "):
                cpu, rss, up = line.split()[1:4]
                out.cpu_s, out.maxrss_kib, out.up_at = float(cpu), int(rss), float(up)
        if not result.ok:
            out.error = ("timed out" if result.timed_out else
                         f"exit {result.exit_code}: {result.stderr.decode('utf-8', 'replace')[-300:]}")
    except Exception as exc:  # a benchmark reports a failed worker and goes on with the rest
        out.error = f"{type(exc).__name__}: {exc}"
    finally:
        if machine is not None:
            with contextlib.suppress(Exception):
                machines.delete(machine)


def _warm_bytecode() -> None:
    """Make the agent's modules' bytecode current on disk, as on any host that ran it once: machines see the
    package read-only and would compile whatever is stale, every one of them at each start. Compiled here, not
    imported: an import writes no bytecode under ``PYTHONDONTWRITEBYTECODE`` (or ``-B``)."""
    import compileall

    import swarmyard
    import swarmyard.agents.entry

    compileall.compile_dir(Path(swarmyard.__file__).parent, quiet=2)
    for module in list(sys.modules.values()):  # the standard library and packages the agent imports
        source = getattr(module, "__file__", None)
        if source and source.endswith(".py"):
            compileall.compile_file(source, quiet=2)


def measure(workers: int, *, steps: int = 1, latency_s: float = 30.0) -> SandboxedRun:
    """Serve the plane + broker in their own process, then run ``workers`` sandboxed agents at once."""
    from swarmyard.agents.settings import AgentSettings
    from swarmyard.auth.tokens import TokenAuthority, load_or_create_secret
    from swarmyard.machines.api import Machines
    from swarmyard.store import open_store

    _warm_bytecode()
    folder = Path(tempfile.mkdtemp(prefix="sy-bench-sbx-", dir="/tmp"))  # short: socket paths are limited
    url, sock, secret = f"sqlite:///{folder / 'store.db'}", folder / "plane.sock", folder / "secret"
    store = open_store(url)
    goal = store.create_goal(GoalSpec("bench swarm sandboxed", 10**12, workers * (3 * steps + 2))).id
    for i in range(workers):
        store.create_task(goal, TaskSpec(f"task {i}", budget_micro_usd=10**6))
    authority = TokenAuthority(load_or_create_secret(secret), store)
    issued = [authority.issue(goal, "main", ttl_s=24 * 3600) for _ in range(workers)]
    tokens = [token for token, _ in issued]
    server = mp.get_context("spawn").Process(target=serve_plane, args=(url, str(sock), str(secret), latency_s, 1))
    server.start()
    assert server.pid is not None  # started
    # as a run sets it for its workers (a heartbeat every quarter of the default 120 s lease)
    settings = AgentSettings(plane_url="", token="", model=MODEL, max_steps=steps, heartbeat_s=30.0)
    env = {_MARK: folder.name}
    agents = [_Agent() for _ in range(workers)]
    timeout_s = 600.0 + workers + 3 * steps * latency_s  # a bound on a stuck agent, never reached by a working one
    try:
        wait_ready(sock, server, 1)
        machines = Machines("local", max_concurrent=workers, boot_timeout_s=600.0)
        sampler = _Sampler(folder.name)
        server_cpu, bench_cpu = tree_cpu_s(server.pid), time.process_time()
        began = time.perf_counter()
        sampler.start(workers)
        try:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bench-agent") as pool:
                for i in range(workers):
                    pool.submit(_worker, machines, i, sock, replace(settings, token=tokens[i]), env, timeout_s,
                                agents[i])
            wall = time.perf_counter() - began
        finally:
            sampler.stop()
            machines.close()
        server_cpu, bench_cpu = tree_cpu_s(server.pid) - server_cpu, time.process_time() - bench_cpu
        calls: dict[str, int] = {}
        first_hold: dict[str, float] = {}  # task -> when its first call was held
        for hold in store.list_reservations(goal):
            calls[hold.task_id] = calls.get(hold.task_id, 0) + 1
            first_hold[hold.task_id] = min(hold.created_at, first_hold.get(hold.task_id, hold.created_at))
        task_of = {t.worker_id: t.id for t in store.list_tasks(goal) if t.worker_id}
        phases = _phases(agents, [who.worker_id for _, who in issued], task_of, first_hold)
        findings = len(store.read_findings(goal, limit=workers + 10))
    finally:
        server.terminate()
        server.join(timeout=10)
        store.close()
        shutil.rmtree(folder, ignore_errors=True)
    per_agent = max(calls.values(), default=0)
    failures = tuple(a.error for a in agents if a.error)
    # a claim, each call, each step's report, the finding and the last step's report
    requests = workers * 2 + sum(calls.values()) + workers * (steps + 1)
    return SandboxedRun(
        workers, latency_s, per_agent, wall, len(failures), findings,
        sampler.all_up_at if sampler.all_up_at is not None else wall, sampler.most_alive, sampler.drop_at_most,
        tuple(a.cpu_s for a in agents if a.cpu_s is not None),
        tuple(a.maxrss_kib for a in agents if a.maxrss_kib is not None),
        tuple(a.boot_s for a in agents if a.boot_s), server_cpu, bench_cpu, requests, failures[:5], phases,
        *sampler.busy_until(max((p.first_call_s for p in phases), default=wall)))


def _phases(agents: list[_Agent], workers: list[str], task_of: dict[str, str],
            first_hold: dict[str, float]) -> tuple[Phases, ...]:
    """Each agent's phases up to its first held call (agents that made none, or said no times, are left out)."""
    start = min((a.began_at for a in agents if a.began_at), default=0.0)
    found = []
    for agent, worker in zip(agents, workers, strict=True):
        held = first_hold.get(task_of.get(worker, ""))
        if held is None or not agent.up_at or not agent.ready_at:
            continue
        found.append(Phases(agent.boot_s, agent.up_at - agent.ready_at, held - agent.up_at, held - start))
    return tuple(found)


def _median(values: tuple[float, ...] | tuple[int, ...]) -> float:
    ordered = sorted(values)
    return float(ordered[len(ordered) // 2]) if ordered else 0.0


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, (9 * len(ordered)) // 10)] if ordered else 0.0


def phase_summary(phases: tuple[Phases, ...]) -> dict[str, float]:
    """Where the agents' time went before their first model call: the median and p90 of each phase, and when the
    last agent made its first call (from the start of the burst)."""
    out: dict[str, float] = {}
    for name in ("boot_s", "start_s", "to_call_s", "first_call_s"):
        values = [getattr(p, name) for p in phases]
        out[f"phase_{name[:-2]}_s_median"] = round(_median(tuple(values)), 3)
        out[f"phase_{name[:-2]}_s_p90"] = round(_p90(values), 3)
    out["last_first_call_s"] = round(max((p.first_call_s for p in phases), default=0.0), 3)
    return out


def summary_of(got: SandboxedRun, cores: int) -> dict[str, float | int | bool]:
    """The JSON summary of one run (the keys ``--json`` prints)."""
    agent_cpu = sum(got.agent_cpu_s)
    busy = agent_cpu + got.server_cpu_s + got.bench_cpu_s
    return {
        **phase_summary(got.phases),
        "workers": got.workers,
        "sandboxed": True,
        "wall_s": round(got.wall_s, 3),
        "ideal_s": got.ideal_s,
        "overhead_ratio": round(got.overhead_ratio, 3),
        "calls_per_agent": got.calls_per_agent,
        "latency_s": got.latency_s,
        "errors": got.errors,
        "findings": got.findings,
        "last_agent_up_s": round(got.last_up_s, 3),
        "most_alive": got.most_alive,
        "memory_per_machine_mib": round(got.memory_per_machine_bytes / 2**20, 1),
        "agent_peak_rss_mib_median": round(_median(got.agent_maxrss_kib) / 1024, 1),
        "agent_cpu_s_median": round(_median(got.agent_cpu_s), 3),
        "machine_boot_s_median": round(_median(got.boot_s), 3),
        "server_cpu_ms_per_request": round(got.server_cpu_s * 1e3 / max(1, got.requests), 3),
        "host_cpu_s_per_agent": round(busy / max(1, got.workers), 3),
        # its parts: the agent's own process, the plane's per agent, this process's (the Machines API: create,
        # exec, delete, the sampler) per agent; the sandbox around the agent (bwrap, the init) is in none of them
        "agent_cpu_s_mean": round(agent_cpu / max(1, len(got.agent_cpu_s)), 3),
        "server_cpu_s_per_agent": round(got.server_cpu_s / max(1, got.workers), 3),
        "bench_cpu_s_per_agent": round(got.bench_cpu_s / max(1, got.workers), 3),
        # the cores' share this run kept busy over its wall time (the agents, the plane, the machines' host side)
        "cpu_utilisation": round(busy / (got.wall_s * cores), 3) if got.wall_s else 0.0,
        "cores": cores,
        # the whole host's cores from the start until the last agent's first call: near 1, CPU-bound (the cores' work,
        # everyone's: other processes on the host count too); well under 1, agents waited on something serial
        "host_busy_ramp": round(got.host_busy_ramp, 3),
        "host_cpu_s_ramp_per_agent": round(got.host_cpu_s_ramp / max(1, got.workers), 3),
        # what the measured costs allow on this host: agents that start within one ideal, and that fit in memory
        "agents_started_per_ideal": int(got.ideal_s * cores / max(1e-9, busy / max(1, got.workers))),
        "agents_fitting_in_memory": int(_mem_available() // max(1, got.memory_per_machine_bytes)),
    }


def run(quick: bool = False, workers: int = 0) -> BenchResult:
    """Measure ``workers`` sandboxed agents (default: 100 and 500; quick: 8 agents, 2 s calls)."""
    cores = len(os.sched_getaffinity(0))
    result = BenchResult(area="swarm")
    sizes = [workers] if workers else ([8] if quick else [100, 500])
    latency = 2.0 if quick else 30.0
    last: dict[str, float | int | bool] = {}
    for n in sizes:
        got = measure(n, latency_s=latency)
        summary = summary_of(got, cores)
        label = f"{n} sandboxed agents, {got.calls_per_agent} calls of {latency:g} s"
        result.add(BenchRow(f"{label}: wall", got.wall_s, "s", got.ideal_s, "ideal (calls x latency)",
                            "<= 1.5" if n >= 500 else None))
        for name, key, unit in (("last agent up", "last_agent_up_s", "s"),
                                ("memory per machine", "memory_per_machine_mib", "MiB"),
                                ("agent peak RSS (median)", "agent_peak_rss_mib_median", "MiB"),
                                ("agent CPU (median)", "agent_cpu_s_median", "s"),
                                ("host CPU per agent (agents, plane, machines)", "host_cpu_s_per_agent", "s"),
                                ("machine boot (median)", "machine_boot_s_median", "s"),
                                # where each agent's time went before its first model call, phase by phase
                                ("phase 1, machine boot: create until ready (median)", "phase_boot_s_median", "s"),
                                ("phase 1, machine boot: create until ready (p90)", "phase_boot_s_p90", "s"),
                                ("phase 2, agent start: ready until its interpreter runs (median)",
                                 "phase_start_s_median", "s"),
                                ("phase 2, agent start: ready until its interpreter runs (p90)",
                                 "phase_start_s_p90", "s"),
                                ("phase 3, to first call: interpreter up until its first held call (median)",
                                 "phase_to_call_s_median", "s"),
                                ("phase 3, to first call: interpreter up until its first held call (p90)",
                                 "phase_to_call_s_p90", "s"),
                                ("first call, from the start of the burst (median)", "phase_first_call_s_median",
                                 "s"),
                                ("first call, from the start of the burst (p90)", "phase_first_call_s_p90", "s"),
                                ("the last agent's first call, from the start", "last_first_call_s", "s"),
                                ("host cores busy until the last agent's first call (all processes, kernel)",
                                 "host_busy_ramp", "share"),
                                ("host CPU until the last agent's first call, per agent (all processes, kernel)",
                                 "host_cpu_s_ramp_per_agent", "s"),
                                ("server CPU per request", "server_cpu_ms_per_request", "ms")):
            result.add(BenchRow(f"{label}: {name}", float(summary[key]), unit))
        result.summary[f"overhead_ratio_sandboxed_{n}"] = summary["overhead_ratio"]
        if got.errors or got.findings != n:
            result.notes.append(f"{label}: {got.errors} failed, {got.findings} findings; first failures: "
                                f"{'; '.join(got.failures)}")
        last = summary
    result.summary.update(last)
    result.notes.append(
        "real local machines (bubblewrap, own disk and cgroups), the real built-in agent in each, the simulated "
        "provider; every agent starts at once. Saturation: the agents' start-up is CPU, so agents_started_per_ideal "
        "(ideal x cores / host CPU per agent) is how many start within one ideal, and agents_fitting_in_memory "
        "(MemAvailable / memory per machine) how many fit")
    return result
