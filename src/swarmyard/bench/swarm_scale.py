"""``swarmyard bench swarm --workers N --store URL --replicas R``: N workers on one goal of a chosen store.

Each worker is an asyncio client in this process (as in :mod:`swarmyard.bench.swarm`) doing what a built-in
agent does: claim its own task, then ``calls`` rounds of one model call through the broker (a hold reserved and
settled on the goal's budget), one heartbeat and one board post, then a finding. The control plane and the
broker are served by ``R`` processes on one socket over one store (the plane's scale-out: the replicas are
stateless, the store is what they share), a SQLite file or a PostgreSQL database.

The simulated model's latency grows with N (:func:`scaled_latency`): the ideal wall time is ``calls x latency``,
and on a 2-core host N workers' requests take their own CPU whatever the latency, so a fixed latency would
measure the host's cores, not what the plane, the broker and the store add. The scale is in the output.

What is reported beside wall / ideal: holds settled per second on the one goal, tool calls per second, each
route's p50 and p99 as the workers saw them, the peak memory per worker (this process's and the servers'), the
store's rows and transactions per second (PostgreSQL's own counters; SQLite: rows added), the tasks two
workers both held (must be 0), and whether the goal's envelope is exact after: its settled amount equal to the
sum of its settled holds, and every task's likewise, with no hold left held.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from swarmyard.bench.result import BenchResult, BenchRow
from swarmyard.bench.swarm_plane import MODEL, WorkerClient, run_on_uvloop, tree_cpu_s, wait_ready
from swarmyard.domain import GoalSpec, Price, Quotas, ReservationState, TaskSpec

#: seconds of simulated model latency per worker: at this scale the host's two cores serve every worker's
#: requests of one round within a fraction of the latency (see the module's docstring)
LATENCY_PER_WORKER_S = 0.006
#: the latency below which the scale never goes (small swarms: a few seconds, as a fast model answers)
MIN_LATENCY_S = 5.0
#: rounds of (model call, heartbeat, board post) per worker
CALLS = 3
#: connections opening at once: a Unix socket's listen backlog refuses a connect over it (EAGAIN), so the
#: workers' first requests (their claims) are let through this many at a time, as a run ramps its workers in
OPENING = 1024
ROUTES = ("claim_task", "model_call", "heartbeat", "board_post", "submit_finding")


def scaled_latency(workers: int) -> float:
    """The simulated model's latency for ``workers`` workers: ``LATENCY_PER_WORKER_S`` each, at least
    ``MIN_LATENCY_S``."""
    return max(MIN_LATENCY_S, workers * LATENCY_PER_WORKER_S)


def _app_from_env() -> Any:
    """The control plane with the broker mounted on the simulated provider, as ``swarmyard serve`` sets it up
    (its lease renewal interval; the per-worker rate limit lifted so that it does not cap the measurement)."""
    from swarmyard.auth.tokens import TokenAuthority, load_or_create_secret
    from swarmyard.broker.app import broker_routes
    from swarmyard.broker.providers.simulated import SimulatedProvider
    from swarmyard.broker.settings import BrokerSettings, ModelRoute
    from swarmyard.plane.app import create_app
    from swarmyard.plane.settings import PlaneSettings
    from swarmyard.store import open_store

    store = open_store(os.environ["SWARMYARD_BENCH_STORE"], serving=True)
    tokens = TokenAuthority(load_or_create_secret(Path(os.environ["SWARMYARD_BENCH_SECRET"])), store)
    provider = SimulatedProvider(name="sim", latency_s=float(os.environ["SWARMYARD_BENCH_LATENCY_S"]),
                                 output_tokens=16)
    routes = broker_routes(store, tokens, {"sim": provider},
                           BrokerSettings(routes=(ModelRoute(MODEL, "sim", max_output_tokens=64),)))
    settings = PlaneSettings(renew_min_interval_s=5.0, rate_per_s=1000.0, rate_burst=1000)
    return create_app(store, tokens, settings, extra_routes=routes)


def _serve(url: str, socket_path: str, secret_path: str, latency_s: float, replicas: int, tag: str) -> None:
    """``replicas`` plane + broker processes on one socket over ``url`` (``serve_processes``: forked, each opens
    its own store connections), or one process. Their PostgreSQL sessions are named ``tag``."""
    from swarmyard.plane.server import Listen, serve, serve_processes

    os.environ.update(SWARMYARD_BENCH_STORE=url, SWARMYARD_BENCH_SECRET=secret_path,
                      SWARMYARD_BENCH_LATENCY_S=str(latency_s), PGAPPNAME=tag)
    listen = Listen(Path(socket_path))
    if replicas == 1:
        serve(_app_from_env(), listen)
    else:
        serve_processes(_app_from_env, listen, replicas)


@dataclass(slots=True)
class _Seen:
    """What the workers saw: each route's latencies (seconds) and the tasks they were given."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: {route: [] for route in ROUTES})
    claimed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def _worker(socket_path: str, token: str, opening: asyncio.Semaphore, seen: _Seen) -> None:
    import httpx

    from swarmyard.agents.model import BrokerChatModel, OutputMode
    from swarmyard.agents.tools import PlaneTools

    lean = WorkerClient(socket_path, token)
    client = cast(httpx.AsyncClient, lean)
    times = seen.latencies
    try:
        tools = PlaneTools(client)
        model = BrokerChatModel(client, MODEL, mode=OutputMode.TEXT, max_tokens=16)
        async with opening:
            asked = time.perf_counter()
            task = await tools.claim()
            times["claim_task"].append(time.perf_counter() - asked)
        if task is None:
            seen.errors.append("no task left to claim")
            return
        seen.claimed.append(task.task_id)
        for step in range(CALLS):
            asked = time.perf_counter()
            await model.reply([{"role": "user", "content": f"step {step}: go on"}])
            times["model_call"].append(time.perf_counter() - asked)
            asked = time.perf_counter()
            await tools.call("heartbeat", {})
            times["heartbeat"].append(time.perf_counter() - asked)
            asked = time.perf_counter()
            await tools.call("board_post", {"kind": "progress", "body": f"step {step} done"})
            times["board_post"].append(time.perf_counter() - asked)
        asked = time.perf_counter()
        await tools.call("submit_finding", {"title": "done", "body": "simulated work", "citations": []})
        times["submit_finding"].append(time.perf_counter() - asked)
    except Exception as exc:  # counted and shown: one failed worker must not hide the others' figures
        seen.errors.append(f"{type(exc).__name__}: {exc}"[:300])
    finally:
        await lean.aclose()


async def _drive(socket_path: str, tokens: list[str]) -> tuple[float, _Seen]:
    seen = _Seen()
    opening = asyncio.Semaphore(OPENING)
    began = time.perf_counter()
    await asyncio.gather(*(_worker(socket_path, t, opening, seen) for t in tokens))
    return time.perf_counter() - began, seen


def _status_kib(pid: int | str, key: str) -> int:
    """A ``/proc/PID/status`` figure in KiB (``VmRSS``, ``VmHWM``); 0 when the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _tree(root: int) -> list[int]:
    """``root`` and its descendants (the replica processes)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found = [root]
    for pid in parent:
        walk = pid
        while walk > 1 and walk != root:
            walk = parent.get(walk, 0)
        if walk == root and pid != root:
            found.append(pid)
    return found


class _StoreCounters:
    """The store's own count of rows written and transactions committed (PostgreSQL's ``pg_stat_database``);
    SQLite keeps no such count: the rows its tables gained, and no transaction count."""

    def __init__(self, url: str) -> None:
        import secrets

        self.url = url
        self.postgres = url.startswith(("postgresql://", "postgres://"))
        #: the served processes' sessions carry this name (libpq's ``PGAPPNAME``), to wait for their end
        self.tag = f"swarmyard-bench-{secrets.token_hex(4)}"

    def read(self) -> tuple[int, int | None]:
        """(rows, transactions) so far."""
        if self.postgres:
            import psycopg

            with psycopg.connect(self.url, autocommit=True) as db:
                row = db.execute("SELECT tup_inserted + tup_updated + tup_deleted, xact_commit "
                                 "FROM pg_stat_database WHERE datname = current_database()").fetchone()
            assert row is not None
            return int(row[0]), int(row[1])
        import sqlite3

        with sqlite3.connect(f"file:{self.url.removeprefix('sqlite:///')}?mode=ro", uri=True) as db:
            tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                               "AND name NOT LIKE 'sqlite_%'")]
            return sum(int(db.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]) for t in tables), None

    def settle(self) -> None:
        """Wait (bounded) until the served processes' PostgreSQL sessions have ended: a session reports its
        counts to ``pg_stat_database`` when it ends (or when it has been idle a while). The counts are the
        whole database's: another client of it during the run would be counted too."""
        if not self.postgres:
            return
        import psycopg

        deadline = time.monotonic() + 15
        with psycopg.connect(self.url, autocommit=True) as db:
            while time.monotonic() < deadline:
                row = db.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                                 (self.tag,)).fetchone()
                if row is not None and int(row[0]) == 0:
                    break
                time.sleep(0.1)  # polling another process's exit: there is no event to wait on
            db.execute("SELECT pg_stat_clear_snapshot()")


@dataclass(frozen=True, slots=True)
class ScaleRun:
    """One measured run."""

    workers: int
    replicas: int
    engine: str
    latency_s: float
    wall_s: float
    errors: tuple[str, ...]
    duplicates: int
    findings: int
    holds_settled: int
    holds_left_held: int
    envelope_exact: bool
    envelope: dict[str, int]
    latencies_ms: dict[str, dict[str, float]]
    tool_calls: int
    rows: int
    transactions: int | None
    client_peak_kib: int
    servers_peak_kib: int
    server_cpu_s: float
    client_cpu_s: float
    setup_s: float

    @property
    def ideal_s(self) -> float:
        """Every worker in parallel, nothing but the model's latency."""
        return CALLS * self.latency_s

    @property
    def overhead_ratio(self) -> float:
        """``wall / ideal``."""
        return self.wall_s / self.ideal_s


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        return {"p50": 0.0, "p99": 0.0, "max": 0.0, "count": 0}
    return {"p50": round(ordered[n // 2] * 1e3, 2), "p99": round(ordered[min(n - 1, int(n * 0.99))] * 1e3, 2),
            "max": round(ordered[-1] * 1e3, 2), "count": n}


def _envelope_check(store: Any, goal_id: str) -> tuple[bool, dict[str, int], int, int]:
    """(exact, the goal's envelope, holds settled, holds still held) once every settlement is written.

    Exact: the goal's settled amount is the sum of its settled holds' actual costs, every task's is the sum
    of its own, and no hold is left held (the workers are done: a held one would be a lost settlement)."""
    deadline = time.monotonic() + 30
    while store.list_reservations(goal_id, state=ReservationState.HELD) and time.monotonic() < deadline:
        time.sleep(0.1)  # settlements are written just after each answer: wait for the last few, bounded
    held = len(store.list_reservations(goal_id, state=ReservationState.HELD))
    settled = store.list_reservations(goal_id, state=ReservationState.SETTLED)
    per_task: Counter[str] = Counter()
    for r in settled:
        per_task[r.task_id] += r.actual or 0
    goal = store.get_goal(goal_id)
    tasks_exact = all(t.envelope.settled == per_task.get(t.id, 0) for t in store.list_tasks(goal_id))
    envelope = {"limit": goal.envelope.limit, "reserved": goal.envelope.reserved, "settled": goal.envelope.settled,
                "sum_of_settled_holds": sum(per_task.values()), "calls": goal.envelope.calls}
    exact = goal.envelope.settled == envelope["sum_of_settled_holds"] and tasks_exact and held == 0
    return exact, envelope, len(settled), held


def measure(workers: int, *, store_url: str | None, replicas: int,
            latency_s: float | None = None) -> ScaleRun:
    """Set up one goal of ``workers`` tasks in ``store_url`` (a fresh SQLite file when None), serve it with
    ``replicas`` processes, run the workers, and read what the store holds after."""
    from swarmyard.auth.tokens import TokenAuthority, load_or_create_secret
    from swarmyard.store import open_store

    latency = latency_s if latency_s is not None else scaled_latency(workers)
    folder = Path(tempfile.mkdtemp(prefix="sy-bench-scale-", dir="/tmp"))  # short: socket paths are limited
    url = store_url or f"sqlite:///{folder / 'store.db'}"
    sock, secret = folder / "plane.sock", folder / "secret"
    started = time.perf_counter()
    counters = _StoreCounters(url)
    server: Any = None
    store = open_store(url)
    try:
        # a price, so that every settled hold moves money and the envelopes' check after has amounts to add up
        store.set_price(Price(MODEL, input_per_mtok=1_000_000, output_per_mtok=2_000_000))
        # the goal's board quota raised to the workers' posts (the default, 10,000 posts, is one post per
        # worker at 10,000: measured, it refused every worker's second post)
        quotas = Quotas(board_posts=workers * CALLS + 100, board_bytes=workers * CALLS * 1024 + 2**20)
        # no call cap on the goal: a goal that caps calls gives its tasks no escrow slices (their holds charge its
        # row), and the one-goal hold path at scale is what this bench measures; each worker makes CALLS calls
        goal = store.create_goal(GoalSpec("bench swarm at scale", 10**12, 0, quotas=quotas)).id
        for i in range(workers):
            store.create_task(goal, TaskSpec(f"task {i}", budget_micro_usd=10**6))
        authority = TokenAuthority(load_or_create_secret(secret), store)
        tokens = [authority.issue(goal, "main", ttl_s=3600)[0] for _ in range(workers)]
    finally:
        store.close()  # its sessions end before the store's counters are read: the setup is not counted
    setup_s = time.perf_counter() - started
    try:
        time.sleep(1.1 if counters.postgres else 0.0)  # the setup's sessions report their counts as they end
        rows0, xacts0 = counters.read()
        server = mp.get_context("spawn").Process(target=_serve, args=(url, str(sock), str(secret), latency,
                                                                      replicas, counters.tag))
        server.start()
        assert server.pid is not None  # started
        wait_ready(sock, server, replicas)
        pids = _tree(server.pid)
        servers_before = sum(_status_kib(p, "VmRSS") for p in pids)
        client_before = _status_kib("self", "VmRSS")
        server_cpu, client_cpu = tree_cpu_s(server.pid), time.process_time()
        wall, seen = run_on_uvloop(_drive(str(sock), tokens))
        server_cpu, client_cpu = tree_cpu_s(server.pid) - server_cpu, time.process_time() - client_cpu
        servers_peak = sum(_status_kib(p, "VmHWM") for p in _tree(server.pid)) - servers_before
        client_peak = _status_kib("self", "VmHWM") - client_before
        store = open_store(url)
        try:
            exact, envelope, settled, held = _envelope_check(store, goal)
            findings = len(store.read_findings(goal, limit=workers + 10))
        finally:
            store.close()
        server.terminate()
        server.join(timeout=30)
        counters.settle()
        rows1, xacts1 = counters.read()
    finally:
        if server is not None and server.is_alive():
            server.kill()
            server.join(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
    duplicates = sum(c - 1 for c in Counter(seen.claimed).values() if c > 1)
    tool_calls = sum(len(v) for k, v in seen.latencies.items() if k != "model_call")
    latencies = {route: _percentiles(values) for route, values in seen.latencies.items()}
    latencies["model_call_beyond_latency"] = _percentiles([max(0.0, t - latency)
                                                           for t in seen.latencies["model_call"]])
    return ScaleRun(workers, replicas, "postgresql" if counters.postgres else "sqlite", latency, wall,
                    tuple(seen.errors), duplicates, findings, settled, held, exact, envelope, latencies, tool_calls,
                    rows1 - rows0, None if xacts0 is None or xacts1 is None else xacts1 - xacts0,
                    max(0, client_peak), max(0, servers_peak), server_cpu, client_cpu, setup_s)


def _redacted(url: str) -> str:
    """The store's URL without a password."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def run(workers: int, store_url: str | None, replicas: int,
        measure_run: Callable[..., ScaleRun] = measure) -> BenchResult:
    """Measure one size on one store with ``replicas`` serving processes."""
    got = measure_run(workers, store_url=store_url, replicas=replicas)
    result = BenchResult(area="swarm")
    label = (f"{workers} workers on one goal, {got.engine}, {replicas} plane + broker process"
             f"{'es' if replicas > 1 else ''}, {CALLS} calls of {got.latency_s:g} s")
    target = "<= 1.3" if workers >= 10_000 else ("<= 1.15" if workers >= 1000 and replicas == 1 else None)
    result.add(BenchRow(f"{label}: wall", got.wall_s, "s", got.ideal_s, "ideal (calls x latency)", target))
    holds_per_s = got.holds_settled / got.wall_s
    tool_per_s = got.tool_calls / got.wall_s
    result.add(BenchRow(f"{label}: holds settled per second on the one goal", holds_per_s, "holds/s"))
    result.add(BenchRow(f"{label}: tool calls per second", tool_per_s, "calls/s"))
    for route, p in got.latencies_ms.items():
        result.add(BenchRow(f"{label}: {route} p99", p["p99"], "ms"))
    result.add(BenchRow(f"{label}: peak memory per worker (clients + servers)",
                        (got.client_peak_kib + got.servers_peak_kib) / workers, "KiB"))
    result.add(BenchRow(f"{label}: store rows per second", got.rows / got.wall_s, "rows/s"))
    if got.transactions is not None:
        result.add(BenchRow(f"{label}: store transactions per second", got.transactions / got.wall_s, "xact/s"))
    result.summary.update(
        workers=workers, replicas=replicas, store=got.engine, calls=CALLS, latency_s=got.latency_s,
        latency_scale=f"max({MIN_LATENCY_S:g} s, {LATENCY_PER_WORKER_S:g} s x workers)",
        wall_s=round(got.wall_s, 3), ideal_s=round(got.ideal_s, 3), overhead_ratio=round(got.overhead_ratio, 3),
        holds_per_s=round(holds_per_s, 1), holds_offered_per_s=round(workers / got.latency_s, 1),
        holds_settled=got.holds_settled, holds_left_held=got.holds_left_held,
        tool_calls=got.tool_calls, tool_calls_per_s=round(tool_per_s, 1),
        p99_ms={route: p["p99"] for route, p in got.latencies_ms.items()},
        latencies_ms=got.latencies_ms,
        peak_memory_kib_per_worker=round((got.client_peak_kib + got.servers_peak_kib) / workers, 1),
        client_peak_kib_per_worker=round(got.client_peak_kib / workers, 1),
        servers_peak_kib_per_worker=round(got.servers_peak_kib / workers, 1),
        store_rows=got.rows, store_rows_per_s=round(got.rows / got.wall_s, 1),
        store_transactions=got.transactions,
        store_transactions_per_s=None if got.transactions is None else round(got.transactions / got.wall_s, 1),
        duplicates=got.duplicates, envelope_exact=got.envelope_exact, envelope=got.envelope,
        findings=got.findings, errors=len(got.errors),
        server_cpu_ms_per_request=round(got.server_cpu_s * 1e3 / max(1, got.tool_calls + got.holds_settled), 3),
        client_cpu_ms_per_request=round(got.client_cpu_s * 1e3 / max(1, got.tool_calls + got.holds_settled), 3),
        setup_s=round(got.setup_s, 1), load_average=_loadavg())
    if got.errors:
        result.notes.append(f"{len(got.errors)} workers failed; first: {got.errors[0]}")
    if got.duplicates:
        result.notes.append(f"{got.duplicates} tasks were held by two workers")
    if not got.envelope_exact:
        result.notes.append(f"the goal's envelope is not exact after the run: {got.envelope}, "
                            f"{got.holds_left_held} holds left held")
    result.notes.append(
        f"store {_redacted(store_url) if store_url else 'a fresh SQLite file'}; workers are in-process asyncio "
        f"clients of the real plane and broker (not sandboxed), at most {OPENING} opening a connection at once; "
        f"the simulated model's latency is scaled with the swarm ({result.summary['latency_scale']}) so that the "
        "host's cores are not what is measured; store rows and transactions: "
        + ("PostgreSQL's pg_stat_database (rows inserted + updated + deleted, xact_commit) over the run"
           if got.transactions is not None else "the rows SQLite's tables gained (SQLite counts no transactions)"))
    return result


def _loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return ""
