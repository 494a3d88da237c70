"""``swarmyard bench swarm --workers N --store URL --replicas R --json`` through the real CLI in a subprocess, on
SQLite and on PostgreSQL, at a small size. Its figures are measurements and are not asserted; its shape, the
absence of duplicate claims, every worker's finding and the goal's envelope exact after are. Flags that do not
go together are a usage error (exit 2) that says why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

KEYS = {"workers", "replicas", "store", "latency_s", "latency_scale", "wall_s", "ideal_s", "overhead_ratio",
        "holds_per_s", "tool_calls_per_s", "p99_ms", "peak_memory_kib_per_worker", "store_rows_per_s",
        "store_transactions_per_s", "duplicates", "envelope_exact", "envelope", "errors", "load_average"}
ROUTES = {"claim_task", "model_call", "heartbeat", "board_post", "submit_finding"}


def bench(cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd), "LANG": "C.UTF-8"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run([sys.executable, "-m", "swarmyard.cli", "bench", "swarm", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _check(got: dict[str, object], store: str, replicas: int) -> None:
    assert set(got) >= KEYS, sorted(KEYS - set(got))
    assert (got["area"], got["workers"], got["replicas"], got["store"]) == ("swarm", 50, replicas, store)
    assert got["errors"] == 0 and got["duplicates"] == 0 and got["findings"] == 50
    # every worker's 3 calls were held and settled on the one goal, and its envelope adds up after
    assert got["holds_settled"] == 150 and got["holds_left_held"] == 0
    envelope = got["envelope"]
    assert isinstance(envelope, dict) and envelope["settled"] == envelope["sum_of_settled_holds"] > 0
    assert got["envelope_exact"] is True
    assert got["tool_calls"] == 50 * (2 + 2 * 3)  # a claim, 3 heartbeats, 3 board posts and a finding each
    p99 = got["p99_ms"]
    assert isinstance(p99, dict) and set(p99) >= ROUTES
    assert isinstance(got["store_rows_per_s"], float) and got["store_rows_per_s"] > 0


@pytest.mark.slow
def test_swarm_on_a_sqlite_store_through_the_cli(short_tmp: Path) -> None:
    done = bench(short_tmp, "--workers", "50", "--store", str(short_tmp / "swarm.db"), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    _check(got, "sqlite", 1)
    assert got["store_transactions_per_s"] is None  # SQLite counts none; said so rather than made up
    assert (short_tmp / "swarm.db").exists()  # the store asked for, not a temporary one


@pytest.mark.slow
def test_swarm_on_postgresql_with_two_replicas_through_the_cli(short_tmp: Path, pg_url: str) -> None:
    done = bench(short_tmp, "--workers", "50", "--store", pg_url, "--replicas", "2", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    _check(got, "postgresql", 2)
    assert isinstance(got["store_transactions_per_s"], float) and got["store_transactions_per_s"] > 0


@pytest.mark.parametrize(("args", "said"), [
    (("--store", "x.db"), "give it --workers N"),
    (("--workers", "5", "--replicas", "2", "--sandboxed"), "takes no --sandboxed, --compare"),
    (("--workers", "5", "--store", "x.db", "--quick"), "takes no --sandboxed, --compare"),
    (("--replicas", "2", "--compare", "1,2"), "takes no --sandboxed, --compare"),
    (("--workers", "5", "--store", "mysql://db/x"), "neither a SQLite path nor a postgresql:// URL"),
    (("--workers", "5", "--store", "no/such/folder/x.db"), "does not exist"),
])
def test_flags_that_do_not_go_together_are_a_usage_error(short_tmp: Path, args: tuple[str, ...],
                                                         said: str) -> None:
    done = bench(short_tmp, *args, timeout=120)
    assert done.returncode == 2 and said in " ".join(done.stderr.split()), done.stderr[-2000:]


def test_store_flag_is_refused_by_other_areas(short_tmp: Path) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8",
           **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {})}
    done = subprocess.run([sys.executable, "-m", "swarmyard.cli", "bench", "plane", "--store", "x.db"],
                          cwd=short_tmp, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "takes no --store (only swarm does)" in " ".join(done.stderr.split())
