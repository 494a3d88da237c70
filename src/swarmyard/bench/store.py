"""``swarmyard bench store``: claims/s and board posts/s with 1, 8 and 64 claimer processes, and the money path
(holds reserved and settled per second on one goal), on SQLite and PostgreSQL, beside the same claim pattern written as raw SQL in the same run; duplicates counted.

The raw baseline is the bare minimum a queue needs: bump a counter (or ``nextval``), one conditional
``UPDATE ... RETURNING``, commit; no audit event, no domain objects. The ratio shows what the store's extra
guarantees cost.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import sqlite3
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmyard.bench.result import BenchResult, BenchRow
from swarmyard.domain import GoalSpec, PostKind, TaskSpec


@dataclass(frozen=True, slots=True)
class ClaimRun:
    """What one measured run produced."""

    claims: list[tuple[str, int]]
    posts: int
    wall_s: float


def _claimer(url: str, goal_id: str, raw: bool, posts_per_claim: int, ready: Any, start: Any, out: Any) -> None:
    """Claim until nothing is left; report (task, token) pairs. Runs in its own process."""
    got: list[tuple[str, int]] = []
    posts = 0
    if raw:
        claim = _raw_claimer(url, goal_id)
        ready.put(os.getpid())
        start.wait()
        while (pair := claim()) is not None:
            got.append(pair)
    else:
        from swarmyard.store import open_store

        store = open_store(url, pool_size=2)
        worker = f"w{os.getpid()}"
        ready.put(os.getpid())
        start.wait()
        while (c := store.claim(goal_id, worker, 300)) is not None:
            got.append((c.task.id, c.token))
            for _ in range(posts_per_claim):
                store.post(c.task.id, c.token, PostKind.PROGRESS, "bench", author=worker)
                posts += 1
        store.close()
    out.put((got, posts))


def _raw_claimer(url: str, goal_id: str) -> Any:
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None, timeout=60)
        conn.execute("PRAGMA busy_timeout = 60000")
        conn.execute("PRAGMA synchronous = NORMAL")  # the same durability setting the store uses

        from swarmyard.store.sql import claim_pick

        # The same logical claim as the store (pending, or claimed with an expired lease; the same index-served
        # pick), minus what the store adds: the audit event, validation, the writer queue, domain objects.
        sql = (f"UPDATE tasks SET state = 'claimed', fencing_token = ?, worker_id = 'raw', lease_expires_at = ? "
               f"WHERE id = ({claim_pick()}) AND (state = 'pending' OR (state = 'claimed' AND "
               f"lease_expires_at <= ?)) RETURNING id")

        def claim_sqlite() -> tuple[str, int] | None:
            now = time.time()
            conn.execute("BEGIN IMMEDIATE")
            token = conn.execute("UPDATE counters SET value = value + 1 WHERE name = 'fencing' "
                                 "RETURNING value").fetchone()[0]
            row = conn.execute(sql, (token, now + 300, goal_id, goal_id, now, now)).fetchone()
            conn.execute("COMMIT")
            return None if row is None else (row[0], token)

        return claim_sqlite
    import psycopg

    pg = psycopg.connect(url, autocommit=True)

    def claim_pg() -> tuple[str, int] | None:
        now = time.time()
        row = pg.execute("UPDATE tasks SET state = 'claimed', fencing_token = nextval('fencing_seq'), "
                         "worker_id = 'raw', lease_expires_at = %s WHERE id = (SELECT id FROM tasks WHERE "
                         "goal_id = %s AND (state = 'pending' OR (state = 'claimed' AND lease_expires_at <= %s)) "
                         "ORDER BY priority DESC, n LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id, fencing_token",
                         (now + 300, goal_id, now)).fetchone()
        return None if row is None else (row[0], int(row[1]))

    return claim_pg


def _race(target: Any, args: list[tuple[Any, ...]]) -> tuple[float, list[Any]]:
    """Run ``target(*a, ready, start, out)`` in a spawned process per ``a``; once every one is ready, start them
    together and time until each has put its result; (wall_s, results)."""
    ctx = mp.get_context("spawn")
    ready, out, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=target, args=(*a, ready, start, out)) for a in args]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)
    began = time.perf_counter()
    start.set()
    results = [out.get(timeout=600) for _ in procs]
    wall = time.perf_counter() - began
    for p in procs:
        p.join(timeout=60)
    return wall, results


def measure(url: str, *, processes: int, tasks: int, raw: bool, posts_per_claim: int = 0) -> ClaimRun:
    """Create a goal with ``tasks`` tasks and let ``processes`` claimers drain it; time the drain."""
    from swarmyard.store import open_store

    store = open_store(url)
    goal = store.create_goal(GoalSpec("bench", 0, 0)).id
    for i in range(tasks):
        store.create_task(goal, TaskSpec(f"t{i}"))
    store.close()
    wall, results = _race(_claimer, [(url, goal, raw, posts_per_claim)] * processes)
    claims = [pair for got, _ in results for pair in got]
    return ClaimRun(claims=claims, posts=sum(n for _, n in results), wall_s=wall)


def _holder(url: str, goal_id: str, calls: int, ready: Any, start: Any, out: Any) -> None:
    """Claim one task, then make ``calls`` model-call money trips on it: reserve a hold, settle it."""
    from swarmyard.store import open_store

    store = open_store(url, pool_size=2)
    claim = store.claim(goal_id, f"w{os.getpid()}", 600)
    assert claim is not None
    ready.put(os.getpid())
    start.wait()
    for _ in range(calls):
        hold = store.reserve(claim.task.id, claim.token, model="bench", amount=10, method="POST /v1/bench")
        store.settle(hold.id, 7, input_tokens=1, output_tokens=1)
    store.close()
    out.put(calls)


def measure_holds(url: str, *, processes: int, calls: int, one_goal: bool = True) -> tuple[float, int, int]:
    """``processes`` workers each make ``calls`` reserve+settle trips; (wall_s, trips, the goals' settled sum).

    Every trip charges its goal's envelope row in its transaction (the design's rule): with ``one_goal`` every
    worker is on the same goal, so this is the rate one goal's money path can take, whatever the number of
    replicas in front of the store; without it each worker has a goal of its own (the same work, no shared row).
    """
    from swarmyard.store import open_store

    store = open_store(url)
    goals = [store.create_goal(GoalSpec("bench", 10**12, 0)).id for _ in range(1 if one_goal else processes)]
    for i in range(processes):
        store.create_task(goals[i % len(goals)], TaskSpec(f"t{i}", budget_micro_usd=10**10))
    store.close()
    wall, done = _race(_holder, [(url, goals[i % len(goals)], calls) for i in range(processes)])
    trips = sum(done)
    store = open_store(url)
    settled = sum(store.get_goal(goal).envelope.settled for goal in goals)
    store.close()
    return wall, trips, settled


def _taker(url: str, key: str, takes: int, ready: Any, start: Any, out: Any) -> None:
    """Take ``takes`` tokens from ``key``'s shared rate bucket (one a tool call makes on PostgreSQL)."""
    from swarmyard.store import open_store

    store = open_store(url, pool_size=2)
    ready.put(os.getpid())
    start.wait()
    taken = sum(1 for _ in range(takes) if store.take_rate_token(key, 1e9, 10**9) == 0.0)
    store.close()
    out.put(taken)


def measure_takes(url: str, *, processes: int, takes: int, shared: bool) -> tuple[float, int]:
    """``processes`` processes take from the shared rate buckets (one key, or a key each); (wall_s, taken)."""
    tag = f"bench-{os.getpid()}-{time.monotonic_ns()}"
    wall, taken = _race(_taker, [(url, tag if shared else f"{tag}-{i}", takes) for i in range(processes)])
    return wall, sum(taken)


def _tool_writer(url: str, goal_id: str, posts: int, folded: bool, ready: Any, start: Any, out: Any) -> None:
    """Claim one task and make ``posts`` tool calls that write (a board post) with their rate token taken from the
    worker's shared bucket: in the post's own transaction (``folded``), or in a transaction of its own before it."""
    from swarmyard.domain import PostKind
    from swarmyard.store import open_store

    store = open_store(url, pool_size=2)
    key = f"w{os.getpid()}"
    claim = store.claim(goal_id, key, 600)
    assert claim is not None
    ready.put(os.getpid())
    start.wait()
    for i in range(posts):
        if folded:
            with store.rate_token_folded(key, 1e9, 10**9):
                store.post(claim.task.id, claim.token, PostKind.NOTE, f"p{i}", author=key)
        else:
            assert store.take_rate_token(key, 1e9, 10**9) == 0.0
            store.post(claim.task.id, claim.token, PostKind.NOTE, f"p{i}", author=key)
    store.close()
    out.put(posts)


def measure_tool_writes(url: str, *, processes: int, posts: int, folded: bool) -> tuple[float, int]:
    """``processes`` workers each make ``posts`` rate-limited writing tool calls; (wall_s, calls)."""
    from swarmyard.store import open_store

    store = open_store(url)
    goal = store.create_goal(GoalSpec("bench", 0, 0)).id
    for i in range(processes):
        store.create_task(goal, TaskSpec(f"t{i}"))
    store.close()
    wall, done = _race(_tool_writer, [(url, goal, posts, folded)] * processes)
    return wall, sum(done)


def duplicates(claims: list[tuple[str, int]]) -> int:
    """Claims of a task beyond its first (there must be none: every lease here outlives the run)."""
    return sum(n - 1 for n in Counter(task for task, _ in claims).values() if n > 1)


def _pg_url() -> str | None:
    url = os.environ.get("SWARMYARD_BENCH_PG_URL") or os.environ.get("SWARMYARD_TEST_PG_URL")
    if not url:
        return None
    try:
        import psycopg

        with psycopg.connect(url, autocommit=True, connect_timeout=3) as conn:
            conn.execute("DROP SCHEMA IF EXISTS swarmyard_bench CASCADE")
            conn.execute("CREATE SCHEMA swarmyard_bench")
    except Exception:
        return None
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3Dswarmyard_bench"


def run(quick: bool = False, **options: object) -> BenchResult:
    """Measure both engines (PostgreSQL when ``SWARMYARD_BENCH_PG_URL`` or ``SWARMYARD_TEST_PG_URL`` reaches one)."""
    result = BenchResult(area="store")
    levels = [1, 8] if quick else [1, 8, 64]
    tasks = 300 if quick else 2000
    tmp = Path(tempfile.mkdtemp(prefix="swarmyard-bench-"))
    engines: list[tuple[str, str]] = [("sqlite", f"sqlite:///{tmp / 'bench.db'}")]
    pg = _pg_url()
    if pg:
        engines.append(("postgres", pg))
    else:
        result.notes.append("PostgreSQL not reachable (set SWARMYARD_BENCH_PG_URL): measured SQLite only")
    total_dupes = 0
    try:
        for name, url in engines:
            best: dict[str, float] = {}
            for n in levels:
                ours = measure(url, processes=n, tasks=tasks, raw=False)
                raw = measure(url, processes=n, tasks=tasks, raw=True)
                dupes = duplicates(ours.claims) + duplicates(raw.claims)
                total_dupes += dupes
                ours_rate, raw_rate = len(ours.claims) / ours.wall_s, len(raw.claims) / raw.wall_s
                result.add(BenchRow(f"{name} claims/s, {n} proc", ours_rate, "claims/s", raw_rate,
                                    "raw SQL", ">= 0.5 x raw"))
                best["claims"] = max(best.get("claims", 0.0), ours_rate)
                best["raw"] = max(best.get("raw", 0.0), raw_rate)
                result.summary[f"{name}.claims_per_s_{n}"] = round(ours_rate, 1)
                result.summary[f"{name}.raw_claims_per_s_{n}"] = round(raw_rate, 1)
                if len(ours.claims) != tasks or len(raw.claims) != tasks:
                    result.notes.append(f"{name} {n} proc: {len(ours.claims)}/{len(raw.claims)} of {tasks} claimed")
            posting = measure(url, processes=levels[-1], tasks=tasks // 4, raw=False, posts_per_claim=4)
            total_dupes += duplicates(posting.claims)
            post_rate = posting.posts / posting.wall_s
            result.add(BenchRow(f"{name} board posts/s, {levels[-1]} proc (with claims)", post_rate, "posts/s"))
            result.summary[f"{name}.claims_per_s"] = round(best["claims"], 1)
            result.summary[f"{name}.raw_claims_per_s"] = round(best["raw"], 1)
            result.summary[f"{name}.posts_per_s"] = round(post_rate, 1)
            holders = levels[-1] if name == "postgres" else min(levels[-1], 8)
            rates: dict[bool, float] = {}
            for one_goal in (True, False):
                wall, trips, settled = measure_holds(url, processes=holders, calls=25 if quick else 100,
                                                     one_goal=one_goal)
                rates[one_goal] = trips / wall
                if settled != trips * 7:
                    result.notes.append(f"{name}: the goals settled {settled}, not {trips * 7} (7 per hold)")
            result.add(BenchRow(f"{name} holds/s (reserve + settle), {holders} proc, one goal", rates[True],
                                "holds/s", rates[False], "a goal per process"))
            result.summary[f"{name}.holds_per_s"] = round(rates[True], 1)
            result.summary[f"{name}.holds_per_s_goal_each"] = round(rates[False], 1)
            if name == "postgres":  # SQLite's buckets live in the serving process (one host)
                takes = {shared: measure_takes(url, processes=8, takes=100 if quick else 500, shared=shared)
                         for shared in (True, False)}
                per_s = {shared: taken / wall for shared, (wall, taken) in takes.items()}
                result.add(BenchRow("postgres rate-bucket takes/s (one per tool call across replicas), 8 proc, "
                                    "one key", per_s[True], "takes/s", per_s[False], "a key per process"))
                result.summary["postgres.rate_takes_per_s"] = round(per_s[True], 1)
                result.summary["postgres.rate_takes_per_s_key_each"] = round(per_s[False], 1)
                calls = {folded: measure_tool_writes(url, processes=8, posts=50 if quick else 200, folded=folded)
                         for folded in (True, False)}
                call_s = {folded: n / wall for folded, (wall, n) in calls.items()}
                result.add(BenchRow("postgres writing tool calls/s (board post + rate take in one transaction), "
                                    "8 proc", call_s[True], "calls/s", call_s[False], "the take a transaction of its own"))
                result.summary["postgres.tool_writes_per_s_folded"] = round(call_s[True], 1)
                result.summary["postgres.tool_writes_per_s_separate"] = round(call_s[False], 1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result.summary["duplicates"] = total_dupes
    result.add(BenchRow("duplicate claims", total_dupes, "claims", target="0"))
    return result
